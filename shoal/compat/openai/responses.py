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
conversation is carried by sending its items again. Function tools work as on chat
(see `tools`): `tools` in the Responses shape, `tool_choice`, a call answered as a
`function_call` output item, and `function_call` / `function_call_output` input items in
later requests. With tools offered, a streamed answer's text or call arrives whole at
its end (it is known to be one or the other only then); other tool types are a 400.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import msgspec

from ...config import GatewaySettings
from ...model_registry import ModelSpec
from ...queue.messages import ChoiceDelta, GenerateJob
from .._constraints import ModelName
from ..errors import InvalidRequestError
from ..extensions import ShoalOptions
from ..jobs import Envelope
from .chat import CalledFunction, ChatCompletionRequest, ChatMessage, PastToolCall, joined_text
from .generation import (
    DeltaStream,
    JsonSchemaFormat,
    MaxTokens,
    ResponseFormat,
    Temperature,
    TopP,
)
from .responses_schema import (
    ArgumentsEvent,
    FunctionCallItem,
    IncompleteDetails,
    ItemEvent,
    LifecycleEvent,
    OutputMessage,
    OutputText,
    PartEvent,
    Response,
    ResponseUsage,
    TextConfig,
    TextDeltaEvent,
    TextDoneEvent,
    TextFormat,
)
from .tools import FunctionDef, NamedFunction, NamedToolChoice, Tool, ToolCall, parse_call

__all__ = ["Response", "ResponseRequest"]

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text")


class InputContent(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class InputItem(msgspec.Struct, kw_only=True):
    """An item of `input`: a message, an earlier function call, or its output."""

    role: str | None = None
    content: str | list[InputContent] | None = None
    type: str = "message"
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    id: str | None = None
    status: str | None = None


class FunctionTool(msgspec.Struct, kw_only=True):
    """A tool in the Responses shape (the function's fields at the top level)."""

    type: str
    name: str = ""
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunctionChoice(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    name: str


class ResponseRequest(msgspec.Struct, kw_only=True, dict=True):
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
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    # Set -> 400.
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
        for i, tool in enumerate(self.tools or []):
            if tool.type != "function":
                raise InvalidRequestError(
                    f"tools[{i}]: tools of type '{tool.type}' are not supported (function)",
                    param=f"tools[{i}].type",
                    code="unsupported_parameter",
                )
        unsupported = {
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
            if item.type == "function_call" and item.name:
                call = PastToolCall(
                    id=item.call_id,
                    function=CalledFunction(name=item.name, arguments=item.arguments or "{}"),
                )
                turns.append(ChatMessage(role="assistant", tool_calls=[call]))
            elif item.type == "function_call_output":
                output = ChatMessage(role="tool", content=item.output or "")
                turns.append(msgspec.structs.replace(output, tool_call_id=item.call_id))
            elif item.type == "message" and item.role in _ROLES:
                turns.append(
                    ChatMessage(
                        role=item.role,
                        content=joined_text(item.content, f"input[{i}]", _TEXT_PARTS),
                    )
                )
            else:
                raise InvalidRequestError(
                    f"input[{i}]: items of type '{item.type}' (role '{item.role}') are not "
                    "supported: messages with role "
                    f"{', '.join(_ROLES)}, function_call and function_call_output",
                    param=f"input[{i}]",
                )
        return turns

    def _tools(self) -> tuple[list[Tool] | None, str | NamedToolChoice | None]:
        """`tools` and `tool_choice` in the chat shape."""
        tools = [
            Tool(
                type="function",
                function=FunctionDef(
                    name=t.name, description=t.description, parameters=t.parameters
                ),
            )
            for t in self.tools or []
        ]
        choice = self.tool_choice
        if isinstance(choice, NamedFunctionChoice):
            return tools, NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
        return tools or None, choice

    @functools.cached_property
    def chat(self) -> ChatCompletionRequest:
        """The chat request this response runs as (built once, for the jobs and the
        rendering)."""
        fmt = self.text.format if self.text else TextFormat()
        schema = JsonSchemaFormat(
            name=fmt.name, schema=fmt.schema, strict=fmt.strict, description=fmt.description
        )
        tools, choice = self._tools()
        return ChatCompletionRequest(
            model=self.model,
            messages=self.messages(),
            tools=tools,
            tool_choice=choice,
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
        return self.chat.to_jobs(env, spec, limits)

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
        text, finish = await _drain(stream)
        call = parse_call(text, self.chat.tool_plan)
        item = _call_item(call) if call else OutputMessage(id=f"msg_{secrets.token_hex(16)}")
        _finish(response, item, text, finish, stream)
        return response

    async def events(self, stream: DeltaStream) -> AsyncIterator[msgspec.Struct]:
        """The streamed response, as the Responses API sends it."""
        response = self._response(f"resp_{secrets.token_hex(16)}", stream.model, time.time())
        seq = _Counter()
        yield LifecycleEvent("response.created", seq(), response)
        yield LifecycleEvent("response.in_progress", seq(), response)
        plan = self.chat.tool_plan
        finish = "stop"
        if plan.names:
            # A call or text: known at the end only.
            text, finish = await _drain(stream)
            call = parse_call(text, plan)
            if call is not None:
                item = _call_item(call)
                _finish(response, item, text, finish, stream)
                for event in _call_events(item, seq):
                    yield event
                yield LifecycleEvent("response.completed", seq(), response)
                return

            async def whole() -> AsyncIterator[list[ChoiceDelta]]:
                yield [ChoiceDelta(index=0, text=text)]

            deltas_in: AsyncIterator[list[ChoiceDelta]] = whole()
        else:
            deltas_in = stream.__aiter__()
        item = OutputMessage(id=f"msg_{secrets.token_hex(16)}")
        yield ItemEvent("response.output_item.added", seq(), 0, item)
        part = OutputText(text="")
        yield PartEvent("response.content_part.added", seq(), item.id, 0, 0, part)
        text = ""
        async for deltas in deltas_in:
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


async def _drain(stream: DeltaStream) -> tuple[str, str]:
    """The whole text of a one-choice generation and its finish reason."""
    text, finish = "", "stop"
    async for deltas in stream:
        for d in deltas:
            text += d.text
            finish = d.finish_reason or finish
    return text, finish


def _call_item(call: ToolCall) -> FunctionCallItem:
    return FunctionCallItem(
        id=f"fc_{secrets.token_hex(16)}",
        call_id=call.id,
        name=call.function.name,
        arguments=call.function.arguments,
    )


def _call_events(item: FunctionCallItem, seq: _Counter) -> list[msgspec.Struct]:
    """A finished call as the Responses stream sends one: added (no arguments yet), the
    arguments, done."""
    opened = msgspec.structs.replace(item, arguments="", status="in_progress")
    return [
        ItemEvent("response.output_item.added", seq(), 0, opened),
        ArgumentsEvent(
            "response.function_call_arguments.delta", seq(), item.id, 0, delta=item.arguments
        ),
        ArgumentsEvent(
            "response.function_call_arguments.done",
            seq(),
            item.id,
            0,
            arguments=item.arguments,
            name=item.name,
        ),
        ItemEvent("response.output_item.done", seq(), 0, item),
    ]


def _finish(
    response: Response,
    item: OutputMessage | FunctionCallItem,
    text: str,
    finish: str,
    stream: DeltaStream,
) -> None:
    """Complete `item` (with `text`, for a message) and `response` with it and the
    usage."""
    cut = finish == "length" and isinstance(item, OutputMessage)
    item.status = "incomplete" if cut else "completed"
    if isinstance(item, OutputMessage):
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
