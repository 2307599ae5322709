"""Function tools on chat completions through the official openai SDK, against real
gateway and generation worker processes: a forced call always parses and validates
against its function's schema, streamed and whole answers agree under one seed, tool
results go back in later turns, and what cannot be served is a clear 400. (The small
built-in model chooses tools poorly; the protocol is what is tested.)"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.agent_check import assert_agent_calls_add
from tests.helpers import GEN_MODEL

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {"name": "add", "description": "Add two integers", "parameters": ADD},
    },
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(stack: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack}/v1", api_key="unused", max_retries=0)


def _valid_call(call) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_named_function_is_always_called_with_valid_arguments(client, seed: int) -> None:
    r = client.chat.completions.create(
        model=GEN_MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}},
        max_tokens=100,
        temperature=1.0,
        seed=seed,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "add"
    _valid_call(call)


def test_required_calls_one_of_the_functions(client) -> None:
    r = client.chat.completions.create(
        model=GEN_MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=100,
        temperature=0,
    )
    [call] = r.choices[0].message.tool_calls
    assert call.function.name in SCHEMAS
    _valid_call(call)
    assert r.choices[0].finish_reason == "tool_calls"


def test_streamed_calls_arrive_as_openai_sends_them_and_agree_with_the_whole(client) -> None:
    common = {
        "model": GEN_MODEL,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": 100,
        "temperature": 0.9,
        "seed": 11,
    }
    whole = client.chat.completions.create(**common)
    chunks = list(client.chat.completions.create(**common, stream=True))
    name, arguments, ids, finish = "", "", set(), None
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                assert delta.index == 0
                ids.add(delta.id) if delta.id else None
                name += delta.function.name or ""
                arguments += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    [call] = whole.choices[0].message.tool_calls
    assert finish == "tool_calls" and len(ids) == 1
    assert (name, json.loads(arguments)) == (
        call.function.name,
        json.loads(call.function.arguments),
    )


def test_tool_results_go_back_in_a_later_turn(client) -> None:
    first = client.chat.completions.create(
        model=GEN_MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=100,
        temperature=0,
    )
    call = first.choices[0].message.tool_calls[0]
    messages = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    second = client.chat.completions.create(
        model=GEN_MODEL,
        messages=messages,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=16,
        temperature=0,
    )
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].message.content
    # The call and its result were in the prompt.
    alone = client.chat.completions.create(
        model=GEN_MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=1
    )
    assert second.usage.prompt_tokens > alone.usage.prompt_tokens + 10


def test_auto_answers_in_text_or_with_a_valid_call(client) -> None:
    r = client.chat.completions.create(
        model=GEN_MODEL, messages=ASK, tools=TOOLS, max_tokens=60, temperature=0
    )
    choice = r.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        _valid_call(choice.message.tool_calls[0])
    else:
        assert choice.message.content and choice.finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
            "tools[0].function.name",
        ),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        (
            {"response_format": {"type": "json_object"}, "tool_choice": "required"},
            "response_format",
        ),
    ],
)
def test_bad_tools_are_a_clear_400(client, extra: dict, param: str) -> None:
    body = {"model": GEN_MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 4, **extra}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(**body)
    assert raised.value.body["param"] == param


def test_completions_still_refuse_tools(client) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(
            model=GEN_MODEL, prompt="hi", max_tokens=4, extra_body={"tools": TOOLS}
        )
    assert raised.value.body["code"] == "unsupported_parameter"


def test_an_openai_agents_agent_calls_a_function_tool(stack: str) -> None:
    """The OpenAI Agents SDK with a custom client and `OpenAIChatCompletionsModel`."""
    from agents import OpenAIChatCompletionsModel

    assert_agent_calls_add(
        lambda client: OpenAIChatCompletionsModel(
            model=GEN_MODEL, openai_client=client(base_url=f"{stack}/v1", api_key="unused")
        )
    )


def get_weather(city: str, unit: str) -> str:
    """Weather in a city.

    Args:
        city: the city's name
        unit: celsius or fahrenheit
    """
    return f"sunny in {city}"


def test_langchain_streams_the_same_call_it_invokes(stack: str) -> None:
    """langchain-openai reads `chunk.choices[0]` only: a streamed call whose arguments or
    finish reason shared a chunk with its name reached it with `args: {}`."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=GEN_MODEL, base_url=f"{stack}/v1", api_key="unused", temperature=0, max_tokens=60
    ).bind_tools([get_weather], tool_choice="get_weather")
    question = "What is the weather in Oslo?"
    invoked = llm.invoke(question)
    chunks = list(llm.stream(question))
    streamed = chunks[0]
    for chunk in chunks[1:]:
        streamed += chunk
    [call] = invoked.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city", "unit"}
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [(call["name"], call["args"])]
    assert streamed.response_metadata["finish_reason"] == "tool_calls"


def test_a_plain_loop_over_choices_0_gets_a_streamed_call(client) -> None:
    """The openai SDK iterated the commonest way: each chunk's `choices[0]`."""
    stream = client.chat.completions.create(
        model=GEN_MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=100,
        temperature=0,
        stream=True,
    )
    name, arguments, finish = "", "", None
    for chunk in stream:
        choice = chunk.choices[0]
        for call in choice.delta.tool_calls or []:
            name += call.function.name or ""
            arguments += call.function.arguments or ""
        finish = choice.finish_reason or finish
    assert name == "get_weather" and finish == "tool_calls"
    jsonschema.validate(json.loads(arguments), WEATHER)
