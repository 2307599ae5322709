"""OpenAI chat completions: https://platform.openai.com/docs/api-reference/chat"""

from __future__ import annotations

import functools
import secrets
import time
from collections.abc import AsyncIterator
from typing import Annotated, Literal

import msgspec

from ...config import GatewaySettings
from ...model_registry import ModelSpec
from ...queue.messages import ChatTurn, ChoiceDelta, GenerateJob
from .._constraints import ModelName
from ..errors import InvalidRequestError
from ..extensions import ShoalOptions
from ..jobs import Envelope, check_texts
from .generation import (
    ChatLogprob,
    CompletionUsage,
    DeltaStream,
    MaxTokens,
    ResponseFormat,
    SamplingFields,
    chat_logprob,
    check_max_tokens,
    one_entry_per_choice,
)
from .tools import (
    NamedToolChoice,
    Tool,
    ToolCall,
    ToolPlan,
    call_text,
    parse_call,
    plan_tools,
    result_turn,
)

__all__ = [
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatMessage",
]


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class CalledFunction(msgspec.Struct, kw_only=True):
    name: str
    arguments: str = "{}"


class PastToolCall(msgspec.Struct, kw_only=True):
    """A call an assistant turn made (sent back in a later request)."""

    id: str | None = None
    type: str = "function"
    function: CalledFunction


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[PastToolCall] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True, dict=True):
    # Fields in the order of OpenAI's reference (SamplingFields holds the shared ones).
    """`POST /v1/chat/completions`'s body; renders its response, streamed or whole."""

    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    model: ModelName
    logprobs: bool = False
    max_completion_tokens: MaxTokens | None = None
    max_tokens: MaxTokens | None = None
    response_format: ResponseFormat | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    """Accepted; each choice makes at most one call (see `tools`)."""
    # --- Shoal extensions -------------------------------------------------------------
    shoal: ShoalOptions | None = None
    """Shoal extensions: `{"adapter": NAME}` picks a LoRA adapter of the model."""

    @functools.cached_property
    def tool_plan(self) -> ToolPlan:
        """Checked once per request (each function's schema is compiled to check it), then
        read by `to_jobs` and the rendering.

        Raises: InvalidRequestError for bad tools (see `plan_tools`)."""
        return plan_tools(self.tools, self.tool_choice)

    def turns(self, plan: ToolPlan | None = None) -> list[ChatTurn]:
        """The messages as chat turns, with `plan`'s offer of tools in the system turn, earlier
        calls as the JSON the model is asked to write and tool results as user turns.

        Raises: InvalidRequestError for function roles or non-text content."""
        turns = []
        for i, message in enumerate(self.messages):
            if message.role == "tool":
                turns.append(
                    result_turn(
                        joined_text(message.content, f"messages[{i}]"), message.tool_call_id
                    )
                )
                continue
            if message.role not in ("system", "developer", "user", "assistant"):
                raise InvalidRequestError(
                    f"messages[{i}]: role '{message.role}' is not supported "
                    "(system, developer, user, assistant, tool)",
                    param=f"messages[{i}].role",
                )
            text = joined_text(message.content, f"messages[{i}]")
            if message.role == "assistant" and message.tool_calls:
                calls = [
                    call_text(c.function.name, c.function.arguments) for c in message.tool_calls
                ]
                text = "\n".join([text, *calls] if text else calls)
            turns.append(ChatTurn(role=message.role, content=text))  # type: ignore[arg-type]
        if plan is not None and plan.instructions:
            if turns and turns[0].role in ("system", "developer"):
                first = turns[0]
                turns[0] = ChatTurn(
                    role=first.role, content=f"{first.content}\n\n{plan.instructions}"
                )
            else:
                turns.insert(0, ChatTurn(role="system", content=plan.instructions))
        return turns

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[GenerateJob]:
        """One job, `n` choices.

        Raises: InvalidRequestError (unsupported parameters, bad messages, limits),
        PayloadTooLargeError (more characters than `max_request_chars`)."""
        self.reject_unsupported(served=("tools", "tool_choice", "parallel_tool_calls"))
        plan = self.tool_plan
        if plan.forced and self.response_format and self.response_format.type != "text":
            raise InvalidRequestError(
                "a forced tool call and 'response_format' both constrain the output: send one",
                param="response_format",
            )
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        # max_completion_tokens supersedes the deprecated max_tokens when both are set.
        if self.max_completion_tokens is not None:
            max_tokens, param = self.max_completion_tokens, "max_completion_tokens"
        else:
            max_tokens, param = self.max_tokens or 0, "max_tokens"
        check_max_tokens(max_tokens, param, limits, spec.max_length)
        turns = self.turns(plan)
        check_texts([t.content for t in turns], limits, "messages")
        schema = plan.schema or (self.response_format.schema_text() if self.response_format else "")
        sampling = self.sampling(max_tokens, self.logprobs, self.top_logprobs or 0, schema)
        return [GenerateJob(**env.job_fields(0, 0), messages=turns, n=self.n, sampling=sampling)]

    async def collect(self, stream: DeltaStream) -> ChatCompletion:
        """The whole response, once the generation is done."""
        deltas = [d async for batch in stream for d in batch]
        usage = CompletionUsage.of(stream.prompt_tokens, stream.completion_tokens)
        completion = ChatCompletion.collect(
            f"chatcmpl-{secrets.token_hex(12)}", stream.model, deltas, self.n, self.logprobs, usage
        )
        plan = self.tool_plan
        for choice in completion.choices:
            call = parse_call(choice.message.content or "", plan)
            if call is not None:
                choice.message = ResponseMessage(content=None, tool_calls=[call])
                choice.finish_reason = "tool_calls"
        return completion

    async def events(self, stream: DeltaStream) -> AsyncIterator[ChatCompletionChunk]:
        """The streamed response: a first chunk with the role, one per engine step, and
        with `include_usage` a last one with the usage."""
        cid, created, model = f"chatcmpl-{secrets.token_hex(12)}", int(time.time()), stream.model
        first = [
            ChunkChoice(i, Delta(content="", role="assistant"), None, None) for i in range(self.n)
        ]
        yield ChatCompletionChunk(cid, first, created, model)
        plan = self.tool_plan
        held = _HeldCalls(plan, self.n)
        async for deltas in stream:
            entries = (c for d in deltas for c in held.chunk_choices(d, self.logprobs))
            for choices in one_entry_per_choice(entries):
                yield ChatCompletionChunk(cid, choices, created, model)
        if self.include_usage:
            usage = CompletionUsage.of(stream.prompt_tokens, stream.completion_tokens)
            yield ChatCompletionChunk(cid, [], created, model, usage)


def joined_text(content: str | list | None, where: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """A message's content as one text: a string as it is, or its parts of `kinds` joined.

    Raises: InvalidRequestError naming `where`.content for a part of another type."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.type not in kinds or part.text is None:
            raise InvalidRequestError(
                f"{where}: content parts of type '{part.type}' are not supported",
                param=f"{where}.content",
            )
        parts.append(part.text)
    return "".join(parts)


class _HeldCalls:
    """Streams each choice's text, except text that may be a tool call: a forced call, or,
    with tools offered, text that opens with `{`. That is held to the choice's end and
    sent as OpenAI streams a call, as three entries for three consecutive chunks (the id
    and name, then the arguments, then `finish_reason: tool_calls`), or as the text it
    turned out to be."""

    def __init__(self, plan: ToolPlan, n: int) -> None:
        self.plan = plan
        self.held = [""] * n
        self.holding: list[bool | None] = [True if plan.forced else None] * n
        """Per choice: holding its text, streaming it, or not yet known (None)."""

    def chunk_choices(self, d: ChoiceDelta, logprobs: bool) -> list[ChunkChoice]:
        i = d.index
        if not self.plan.names or self.holding[i] is False:
            return [_chunk_choice(d, logprobs)]
        self.held[i] += d.text
        if self.holding[i] is None and self.held[i].strip():
            self.holding[i] = self.held[i].lstrip().startswith("{")
            if not self.holding[i]:
                return [_chunk_choice(msgspec.structs.replace(d, text=self.held[i]), logprobs)]
        if not d.finish_reason:
            return []
        call = parse_call(self.held[i], self.plan)
        if call is None:
            return [_chunk_choice(msgspec.structs.replace(d, text=self.held[i]), logprobs)]
        head = ToolCallDelta(0, call.id, "function", FunctionDelta(call.function.name, ""))
        body = ToolCallDelta(0, None, None, FunctionDelta(None, call.function.arguments))
        return [
            ChunkChoice(i, Delta(tool_calls=[head]), None, None),
            ChunkChoice(i, Delta(tool_calls=[body]), None, None),
            ChunkChoice(i, Delta(), None, "tool_calls"),
        ]


class ResponseMessage(msgspec.Struct):
    content: str | None
    refusal: str | None = None
    role: Literal["assistant"] = "assistant"
    tool_calls: list[ToolCall] | msgspec.UnsetType = msgspec.UNSET
    """Only on a call (OpenAI's schema has no `null` for it)."""


class ChoiceLogprobs(msgspec.Struct):
    content: list[ChatLogprob] | None
    refusal: list[ChatLogprob] | None = None


class Choice(msgspec.Struct):
    index: int
    message: ResponseMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: str


class ChatCompletion(msgspec.Struct):
    id: str
    choices: list[Choice]
    created: int
    model: str
    usage: CompletionUsage
    object: Literal["chat.completion"] = "chat.completion"

    @classmethod
    def collect(
        cls,
        completion_id: str,
        model: str,
        deltas: list[ChoiceDelta],
        n: int,
        logprobs: bool,
        usage: CompletionUsage,
    ) -> ChatCompletion:
        """The whole response from every delta the stream gave, per choice in order."""
        texts = [""] * n
        lps: list[list[ChatLogprob]] = [[] for _ in range(n)]
        finish = ["stop"] * n
        for d in deltas:
            texts[d.index] += d.text
            lps[d.index].extend(chat_logprob(lp) for lp in d.logprobs)
            if d.finish_reason:
                finish[d.index] = d.finish_reason
        choices = [
            Choice(
                i,
                ResponseMessage(texts[i]),
                ChoiceLogprobs(lps[i]) if logprobs else None,
                finish[i],
            )
            for i in range(n)
        ]
        return cls(
            id=completion_id, choices=choices, created=int(time.time()), model=model, usage=usage
        )


class FunctionDelta(msgspec.Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct, omit_defaults=True):
    index: int
    id: str | None = None
    type: str | None = None
    function: FunctionDelta | None = None


class Delta(msgspec.Struct, omit_defaults=True):
    content: str | None = None
    role: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(msgspec.Struct):
    index: int
    delta: Delta
    logprobs: ChoiceLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    choices: list[ChunkChoice]
    created: int
    model: str
    usage: CompletionUsage | None = None
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"


def _chunk_choice(d: ChoiceDelta, logprobs: bool) -> ChunkChoice:
    lps = ChoiceLogprobs([chat_logprob(lp) for lp in d.logprobs]) if logprobs else None
    return ChunkChoice(
        d.index, Delta(content=d.text or None) if d.text else Delta(), lps, d.finish_reason or None
    )
