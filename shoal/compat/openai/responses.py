"""OpenAI's Responses API: https://platform.openai.com/docs/api-reference/responses

`POST /v1/responses` runs on the chat path: `input` (a string, or message items with text
content) and `instructions` become chat turns, and the chat request's jobs, sampling and
`json_schema` constraint do the rest. The answer is one assistant message item with one
`output_text` part; streamed, it is the event sequence the openai SDK's stream accumulator
expects (created, in_progress, output_item.added, content_part.added, output_text.delta
..., output_text.done, content_part.done, output_item.done, then completed, or incomplete
when `max_output_tokens` cut it).

Responses are not stored: `store` must be false or absent (an absent `store` means false
here, where OpenAI would keep it 30 days), and `previous_response_id` is refused, so a
conversation is carried by sending its items again. Tools are not supported yet (400).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import msgspec

from ...config import GatewaySettings
from ...model_registry import ModelSpec
from ...queue.messages import GenerateJob
from .._constraints import ModelName
from ..errors import InvalidRequestError
from ..extensions import ShoalOptions
from ..jobs import Envelope
from .chat import ChatCompletionRequest, ChatMessage
from .generation import (
    DeltaStream,
    JsonSchemaFormat,
    MaxTokens,
    ResponseFormat,
    Temperature,
    TopP,
)

__all__ = ["Response", "ResponseRequest"]

_ROLES = ("user", "system", "developer", "assistant")


class InputContent(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class InputItem(msgspec.Struct, kw_only=True):
    """A message item of `input` (other item types are refused)."""

    role: str | None = None
    content: str | list[InputContent] | None = None
    type: str = "message"


class TextFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str = "response"
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class TextConfig(msgspec.Struct, kw_only=True):
    format: TextFormat = msgspec.field(default_factory=TextFormat)


class ResponseRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/responses`'s body."""

    model: ModelName
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    text: TextConfig | None = None
    stream: bool = False
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    parallel_tool_calls: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # Set -> 400.
    tools: list[Any] | None = None
    tool_choice: Any = None
    previous_response_id: str | None = None
    reasoning: Any = None
    background: bool | None = None
    include: list[str] | None = None
    # --- Shoal extensions -------------------------------------------------------------
    shoal: ShoalOptions | None = None

    def _refuse_unsupported(self) -> None:
        if self.store:
            raise InvalidRequestError(
                "responses are not stored by this server: send 'store': false",
                param="store",
                code="unsupported_parameter",
            )
        unsupported = {
            "tools": bool(self.tools),
            "tool_choice": self.tool_choice not in (None, "none", "auto"),
            "previous_response_id": self.previous_response_id is not None,
            "reasoning": self.reasoning not in (None, {}),
            "background": bool(self.background),
            "include": bool(self.include),
        }
        for name, set_ in unsupported.items():
            if set_:
                raise InvalidRequestError(
                    f"'{name}' is not supported by this server yet",
                    param=name,
                    code="unsupported_parameter",
                )

    def messages(self) -> list[ChatMessage]:
        """`instructions` as a system turn, then `input` as chat turns."""
        turns = [ChatMessage(role="system", content=self.instructions)] if self.instructions else []
        if isinstance(self.input, str):
            return [*turns, ChatMessage(role="user", content=self.input)]
        if not self.input:
            raise InvalidRequestError("'input' must not be empty", param="input")
        for i, item in enumerate(self.input):
            if item.type != "message" or item.role not in _ROLES:
                raise InvalidRequestError(
                    f"input[{i}]: only message items with role {', '.join(_ROLES)} are "
                    f"supported (got type '{item.type}', role '{item.role}')",
                    param=f"input[{i}]",
                )
            turns.append(ChatMessage(role=item.role, content=_text(item, i)))
        return turns

    def chat(self) -> ChatCompletionRequest:
        """The chat request this response runs as."""
        fmt = self.text.format if self.text else TextFormat()
        schema = JsonSchemaFormat(
            name=fmt.name, schema=fmt.schema, strict=fmt.strict, description=fmt.description
        )
        return ChatCompletionRequest(
            model=self.model,
            messages=self.messages(),
            max_completion_tokens=self.max_output_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            response_format=ResponseFormat(
                type=fmt.type, json_schema=schema if fmt.type == "json_schema" else None
            ),
            shoal=self.shoal,
        )

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[GenerateJob]:
        self._refuse_unsupported()
        return self.chat().to_jobs(env, spec, limits)

    def _response(self, rid: str, model: str, created: float) -> Response:
        return Response(
            id=rid,
            created_at=created,
            model=model,
            output=[],
            status="in_progress",
            instructions=self.instructions,
            max_output_tokens=self.max_output_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            text=self.text or TextConfig(),
            metadata=self.metadata or {},
            user=self.user,
        )

    async def collect(self, stream: DeltaStream) -> Response:
        """The whole response, once the generation is done."""
        response = self._response(f"resp_{secrets.token_hex(16)}", stream.model, time.time())
        text, finish = "", "stop"
        async for deltas in stream:
            for d in deltas:
                text += d.text
                finish = d.finish_reason or finish
        _finish(response, OutputMessage(id=f"msg_{secrets.token_hex(16)}"), text, finish, stream)
        return response

    async def events(self, stream: DeltaStream) -> AsyncIterator[msgspec.Struct]:
        """The streamed response, as the Responses API sends it."""
        response = self._response(f"resp_{secrets.token_hex(16)}", stream.model, time.time())
        item = OutputMessage(id=f"msg_{secrets.token_hex(16)}")
        seq = _Counter()
        yield LifecycleEvent("response.created", seq(), response)
        yield LifecycleEvent("response.in_progress", seq(), response)
        yield ItemEvent("response.output_item.added", seq(), 0, item)
        part = OutputText(text="")
        yield PartEvent("response.content_part.added", seq(), item.id, 0, 0, part)
        text, finish = "", "stop"
        async for deltas in stream:
            for d in deltas:
                finish = d.finish_reason or finish
                if d.text:
                    text += d.text
                    yield TextDeltaEvent(seq(), item.id, 0, 0, d.text)
        yield TextDoneEvent(seq(), item.id, 0, 0, text)
        yield PartEvent("response.content_part.done", seq(), item.id, 0, 0, OutputText(text=text))
        _finish(response, item, text, finish, stream)
        yield ItemEvent("response.output_item.done", seq(), 0, item)
        kind = "response.completed" if response.status == "completed" else "response.incomplete"
        yield LifecycleEvent(kind, seq(), response)


def _text(item: InputItem, i: int) -> str:
    content = item.content
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.type not in ("input_text", "output_text", "text") or part.text is None:
            raise InvalidRequestError(
                f"input[{i}]: content parts of type '{part.type}' are not supported",
                param=f"input[{i}].content",
            )
        parts.append(part.text)
    return "".join(parts)


def _finish(
    response: Response, item: OutputMessage, text: str, finish: str, stream: DeltaStream
) -> None:
    """Complete `item` with `text` and `response` with it and the usage."""
    cut = finish == "length"
    item.status = "incomplete" if cut else "completed"
    item.content = [OutputText(text=text)]
    response.output = [item]
    response.status = "incomplete" if cut else "completed"
    response.incomplete_details = IncompleteDetails() if cut else None
    response.usage = ResponseUsage(
        input_tokens=stream.prompt_tokens,
        output_tokens=stream.completion_tokens,
        total_tokens=stream.prompt_tokens + stream.completion_tokens,
    )
    response.completed_at = None if cut else time.time()


class _Counter:
    """Each streamed event's `sequence_number`."""

    def __init__(self) -> None:
        self.next = 0

    def __call__(self) -> int:
        self.next += 1
        return self.next - 1


class OutputText(msgspec.Struct, kw_only=True):
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []
    type: Literal["output_text"] = "output_text"


class OutputMessage(msgspec.Struct, kw_only=True):
    id: str
    content: list[OutputText] = []
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
    role: Literal["assistant"] = "assistant"
    type: Literal["message"] = "message"


class InputTokensDetails(msgspec.Struct):
    cached_tokens: int = 0


class OutputTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class ResponseUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails = msgspec.field(default_factory=InputTokensDetails)
    output_tokens_details: OutputTokensDetails = msgspec.field(default_factory=OutputTokensDetails)


class IncompleteDetails(msgspec.Struct):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class Response(msgspec.Struct, kw_only=True):
    id: str
    created_at: float
    model: str
    output: list[OutputMessage]
    status: Literal["in_progress", "completed", "incomplete"]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    text: TextConfig = msgspec.field(default_factory=TextConfig)
    metadata: dict[str, str] = {}
    user: str | None = None
    usage: ResponseUsage | None = None
    incomplete_details: IncompleteDetails | None = None
    completed_at: float | None = None
    error: None = None
    parallel_tool_calls: bool = False
    tool_choice: str = "none"
    tools: list[Any] = []
    store: bool = False
    truncation: str = "disabled"
    object: Literal["response"] = "response"


class LifecycleEvent(msgspec.Struct):
    type: str
    sequence_number: int
    response: Response


class ItemEvent(msgspec.Struct):
    type: str
    sequence_number: int
    output_index: int
    item: OutputMessage


class PartEvent(msgspec.Struct):
    type: str
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class TextDeltaEvent(msgspec.Struct):
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = []
    type: Literal["response.output_text.delta"] = "response.output_text.delta"


class TextDoneEvent(msgspec.Struct):
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = []
    type: Literal["response.output_text.done"] = "response.output_text.done"
