"""What chat and completion requests share: sampling parameters, unsupported parameters,
`response_format`, logprobs, and the conversion to `Sampling`."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Annotated, Any, Literal, Protocol, TypeVar

import msgspec

from ...config import GatewaySettings
from ...queue.messages import ChoiceDelta, Sampling, TokenLogprob
from .._constraints import Seed
from ..errors import InvalidRequestError

__all__ = [
    "CompletionUsage",
    "DeltaStream",
    "JsonSchemaFormat",
    "ResponseFormat",
    "SamplingFields",
    "StreamOptions",
    "TopLogprob",
    "chat_logprob",
    "check_json_schema",
    "check_max_tokens",
    "one_entry_per_choice",
]

Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
MaxTokens = Annotated[int, msgspec.Meta(ge=1)]
N = Annotated[int, msgspec.Meta(ge=1, le=128)]


def check_max_tokens(value: int, param: str, limits: GatewaySettings, context: int) -> None:
    """Raises InvalidRequestError, naming `param` (the field the client set), for more
    tokens than the gateway allows (code max_tokens_too_large) or the model's context."""
    if value > limits.max_tokens:
        raise InvalidRequestError(
            f"'{param}' is {value}; this server generates at most {limits.max_tokens} tokens "
            "per choice",
            param=param,
            code="max_tokens_too_large",
        )
    if value > context:
        raise InvalidRequestError(
            f"'{param}' is {value}, more than the model's context of {context}", param=param
        )


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    name: str = "response"
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def schema_text(self) -> str:
        """The JSON schema the output must match ("" for plain text).

        Raises:
            InvalidRequestError: json_schema without a usable schema.
        """
        if self.type == "text":
            return ""
        if self.type == "json_object":
            return '{"type": "object"}'
        if self.json_schema is None or self.json_schema.schema is None:
            raise InvalidRequestError(
                "response_format json_schema needs 'json_schema.schema'",
                param="response_format.json_schema",
            )
        text = json.dumps(self.json_schema.schema)
        check_json_schema(text)
        return text


def check_json_schema(text: str, param: str = "response_format.json_schema.schema") -> None:
    """Raises InvalidRequestError, naming `param`, unless constrained decoding can compile
    the schema."""
    from llguidance import LLMatcher

    error = LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(text))
    if error:
        raise InvalidRequestError(
            f"{param} cannot be used as a JSON schema: {error}",
            param=param,
            code="invalid_json_schema",
        )


# OpenAI parameters Shoal does not support yet; each one would change the output, so
# a request that sets one gets a 400 naming it instead of having it silently ignored.
UNSUPPORTED = (
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
    "logit_bias",
    "audio",
    "modalities",
    "prediction",
    "web_search_options",
    "suffix",
)


class SamplingFields(msgspec.Struct, kw_only=True):
    """Fields both chat and completions take (OpenAI reference order)."""

    frequency_penalty: Penalty = 0.0
    n: N = 1
    presence_penalty: Penalty = 0.0
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    user: str | None = None
    # Set -> 400 (see UNSUPPORTED).
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None
    logit_bias: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None
    suffix: Any = None

    def reject_unsupported(self, served: tuple[str, ...] = ()) -> None:
        """Raises InvalidRequestError for a set parameter of UNSUPPORTED not in `served`
        (what the request type itself handles)."""
        for name in UNSUPPORTED:
            if name in served:
                continue
            value = getattr(self, name)
            if value not in (None, [], {}, "none", "text", ["text"]):
                raise InvalidRequestError(
                    f"'{name}' is not supported by this server yet",
                    param=name,
                    code="unsupported_parameter",
                )

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 16 or any(not s for s in stops):
            raise InvalidRequestError("'stop' takes up to 16 non-empty strings", param="stop")
        return stops

    def sampling(
        self, max_tokens: int, logprobs: bool, top_logprobs: int, json_schema: str
    ) -> Sampling:
        return Sampling(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed if self.seed is not None else random.getrandbits(31),
            stop=self.stops(),
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            json_schema=json_schema,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class DeltaStream(Protocol):
    """A generation as the gateway runs it: iterated, lists of deltas as they come;
    afterwards its token counts and each choice's prompt (for `echo`)."""

    model: str
    prompt_tokens: int
    completion_tokens: int
    choices: int
    prompts: list[str]

    def __aiter__(self) -> AsyncIterator[list[ChoiceDelta]]: ...


class CompletionUsage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt: int, completion: int) -> CompletionUsage:
        return cls(prompt, completion, prompt + completion)


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


def chat_logprob(lp: TokenLogprob) -> ChatLogprob:
    return ChatLogprob(lp.token, lp.logprob, lp.bytes, [TopLogprob(t, v, b) for t, v, b in lp.top])


class _ChoiceEntry(Protocol):
    @property
    def index(self) -> int: ...


E = TypeVar("E", bound=_ChoiceEntry)


def one_entry_per_choice(entries: Iterable[E]) -> Iterator[list[E]]:
    """A step's choice entries as the `choices` of consecutive chunks, in order, a new
    chunk wherever a choice's index would repeat. OpenAI sends at most one delta per
    choice in a chunk, and most clients read only `chunk.choices[0]` (LangChain, the
    openai SDK's examples): a second entry for a choice in the same chunk is lost to them.
    Every streamed route builds its chunks through this."""
    chunk: list[E] = []
    indices: set[int] = set()
    for entry in entries:
        if entry.index in indices:
            yield chunk
            chunk, indices = [], set()
        chunk.append(entry)
        indices.add(entry.index)
    if chunk:
        yield chunk
