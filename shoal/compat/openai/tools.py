"""Function tools on chat completions: the request's `tools`, `tool_choice` and tool turns
as prompt text, the constraint that makes a forced call parse and validate, and reading
a call back out of the generated text.

The model is told the functions and the one answer format, a JSON object
`{"name": ..., "arguments": {...}}`, in a system turn: every chat template can carry
that, where few small models' templates have a tool format of their own. A forced call
(`tool_choice` "required" or a named function) is generated under a JSON schema of that
object (the function's `parameters` as `arguments`; `anyOf` over the functions for
"required"), through the same constrained decoding as `response_format`, so its
arguments always parse and validate. With "auto" the model answers freely, and an answer
that is such an object naming an offered function becomes the call. One call per
choice: `parallel_tool_calls` is accepted, and a model asked for several makes one.
Earlier calls (assistant `tool_calls`) and their results (`role: tool`) go back into the
prompt as the same JSON and as user turns that name the call.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any, Literal

import msgspec

from ...queue.messages import ChatTurn
from ..errors import InvalidRequestError
from .generation import check_json_schema

__all__ = [
    "FunctionCall",
    "NamedToolChoice",
    "Tool",
    "ToolCall",
    "ToolPlan",
    "parse_call",
    "plan_tools",
]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class FunctionDef(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(msgspec.Struct, kw_only=True):
    name: str


class NamedToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    function: NamedFunction


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str
    """The arguments as a JSON text (OpenAI's shape)."""


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class ToolPlan(msgspec.Struct, kw_only=True):
    """What a request's tools make of its prompt and its output."""

    names: frozenset[str]
    """Functions whose calls are read back from the output (none: tools are off)."""
    instructions: str = ""
    """The system text that offers them."""
    schema: str = ""
    """The JSON schema a forced call is generated under ("" when the model may answer
    in text)."""

    @property
    def forced(self) -> bool:
        return bool(self.schema)


def _parameters(function: FunctionDef) -> dict[str, Any]:
    return function.parameters or {"type": "object", "properties": {}}


def _call_schema(function: FunctionDef) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": function.name}, "arguments": _parameters(function)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def plan_tools(tools: list[Tool] | None, choice: str | NamedToolChoice | None) -> ToolPlan:
    """Check `tools` and `tool_choice` and plan the prompt and the constraint.

    Raises:
        InvalidRequestError: a bad function name or schema, duplicate names, a
            `tool_choice` that names no offered function or needs tools there are not.
    """
    tools = tools or []
    if choice is None:
        choice = "auto" if tools else "none"
    if not tools:
        if choice in ("none", "auto"):
            return ToolPlan(names=frozenset())
        raise InvalidRequestError("'tool_choice' needs 'tools'", param="tool_choice")
    functions = {}
    for i, tool in enumerate(tools):
        function = tool.function
        if not _NAME.match(function.name):
            raise InvalidRequestError(
                "function names are 1-64 letters, digits, '_' or '-'",
                param=f"tools[{i}].function.name",
            )
        if function.name in functions:
            raise InvalidRequestError(
                f"function '{function.name}' is given twice", param=f"tools[{i}].function.name"
            )
        check_json_schema(json.dumps(_call_schema(function)), f"tools[{i}].function.parameters")
        functions[function.name] = function
    if choice == "none":
        return ToolPlan(names=frozenset())
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in functions:
            raise InvalidRequestError(
                f"tool_choice names '{choice.function.name}', which is not in 'tools'",
                param="tool_choice",
            )
        functions = {choice.function.name: functions[choice.function.name]}
    schema = ""
    if choice != "auto":
        calls = [_call_schema(f) for f in functions.values()]
        schema = json.dumps(calls[0] if len(calls) == 1 else {"anyOf": calls})
    return ToolPlan(
        names=frozenset(functions), instructions=_instructions(functions, choice), schema=schema
    )


def _instructions(functions: dict[str, FunctionDef], choice: str | NamedToolChoice) -> str:
    listed = "\n".join(
        json.dumps(
            {"name": f.name, "description": f.description or "", "parameters": _parameters(f)}
        )
        for f in functions.values()
    )
    when = (
        "You may call one of these functions when it helps; otherwise answer normally."
        if choice == "auto"
        else "Call one of these functions now."
    )
    return (
        f"{when} To call a function, answer with only a JSON object "
        '{"name": <function name>, "arguments": <object of its parameters>}.\n'
        f"Functions:\n{listed}"
    )


def call_text(name: str, arguments: str) -> str:
    """An earlier call as the model was asked to write it."""
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        parsed = arguments
    return json.dumps({"name": name, "arguments": parsed})


def result_turn(content: str, call_id: str | None) -> ChatTurn:
    """A `role: tool` message as a user turn naming its call."""
    named = f" of call {call_id}" if call_id else ""
    return ChatTurn(role="user", content=f"Function result{named}:\n{content}")


def parse_call(text: str, plan: ToolPlan) -> ToolCall | None:
    """The call `text` makes, if it is one: a JSON object naming an offered function with
    an object of arguments (a forced call always is, unless `max_tokens` cut it)."""
    if not plan.names:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if (
        not isinstance(value, dict)
        or value.get("name") not in plan.names
        or not isinstance(value.get("arguments"), dict)
    ):
        return None
    return ToolCall(
        id=f"call_{secrets.token_hex(12)}",
        function=FunctionCall(name=value["name"], arguments=json.dumps(value["arguments"])),
    )
