"""What the Responses API answers: the response object, its output items and usage, and
the events of a streamed response (OpenAI's shapes; responses.py builds them)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "ArgumentsEvent",
    "FunctionCallItem",
    "IncompleteDetails",
    "InputTokensDetails",
    "ItemEvent",
    "LifecycleEvent",
    "OutputMessage",
    "OutputText",
    "OutputTokensDetails",
    "PartEvent",
    "Response",
    "ResponseUsage",
    "TextConfig",
    "TextDeltaEvent",
    "TextDoneEvent",
    "TextFormat",
]


class TextFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str = "response"
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class TextConfig(msgspec.Struct, kw_only=True):
    format: TextFormat = msgspec.field(default_factory=TextFormat)


class OutputText(msgspec.Struct, kw_only=True):
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []
    type: Literal["output_text"] = "output_text"


class OutputMessage(msgspec.Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    content: list[OutputText] = []
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
    role: Literal["assistant"] = "assistant"


class FunctionCallItem(msgspec.Struct, kw_only=True, tag_field="type", tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


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
    output: list[OutputMessage | FunctionCallItem]
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
    tool_choice: Any = "auto"
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
    item: OutputMessage | FunctionCallItem


class ArgumentsEvent(msgspec.Struct, omit_defaults=True):
    type: str
    sequence_number: int
    item_id: str
    output_index: int
    delta: str | None = None
    arguments: str | None = None
    name: str | None = None


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
