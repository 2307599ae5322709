"""OpenAI's Responses API through the official openai SDK (`responses.create`,
`responses.stream`, `responses.parse`) against real gateway and generation worker
processes: the same greedy text and usage as chat completions, the event sequence the
SDK's stream accumulator checks, and clear 400s for what is not served."""

from __future__ import annotations

import httpx
import openai
import pydantic
import pytest

from tests.agent_check import assert_agent_calls_add
from tests.helpers import GEN_MODEL

pytestmark = pytest.mark.slow

INSTRUCTIONS = "Answer in one short sentence."
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def client(stack: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack}/v1", api_key="unused", max_retries=0)


def _chat(client, max_tokens: int):
    return client.chat.completions.create(
        model=GEN_MODEL,
        messages=[
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": QUESTION},
        ],
        max_tokens=max_tokens,
        temperature=0,
    )


def test_create_answers_as_chat_does(client) -> None:
    response = client.responses.create(
        model=GEN_MODEL,
        instructions=INSTRUCTIONS,
        input=QUESTION,
        max_output_tokens=12,
        temperature=0,
        store=False,
    )
    chat = _chat(client, 12)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.model == GEN_MODEL
    assert response.output_text == chat.choices[0].message.content
    [item] = response.output
    assert item.type == "message" and item.role == "assistant"
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.usage.total_tokens == chat.usage.total_tokens
    if chat.choices[0].finish_reason == "length":
        assert response.status == "incomplete"
        assert response.incomplete_details.reason == "max_output_tokens"
    else:
        assert response.status == "completed"


def test_message_items_with_text_parts_are_chat_turns(client) -> None:
    items = [
        {"role": "system", "content": [{"type": "input_text", "text": INSTRUCTIONS}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
    ]
    response = client.responses.create(
        model=GEN_MODEL, input=items, max_output_tokens=12, temperature=0
    )
    assert response.output_text == _chat(client, 12).choices[0].message.content


def test_stream_gives_the_same_text_in_the_documented_event_order(client) -> None:
    whole = client.responses.create(
        model=GEN_MODEL,
        instructions=INSTRUCTIONS,
        input=QUESTION,
        max_output_tokens=40,
        temperature=0,
    )
    with client.responses.stream(
        model=GEN_MODEL,
        instructions=INSTRUCTIONS,
        input=QUESTION,
        max_output_tokens=40,
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == whole.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_a_cut_stream_ends_incomplete(client) -> None:
    raw = client.responses.create(
        model=GEN_MODEL,
        input="Count from one to fifty in words.",
        max_output_tokens=3,
        temperature=0,
        stream=True,
    )
    events = list(raw)
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.usage.output_tokens == 3


def _sse_blocks(url: str, body: dict) -> list[str]:
    with httpx.stream("POST", url, json=body, timeout=120) as r:
        assert r.status_code == 200
        return [block for block in r.read().decode().split("\n\n") if block.strip()]


@pytest.mark.parametrize(
    ("question", "max_output_tokens", "last"),
    [
        (QUESTION, 40, "response.completed"),
        ("Count from one to fifty in words.", 3, "response.incomplete"),
    ],
)
def test_a_streamed_response_ends_at_its_last_event_without_done(
    stack: str, question: str, max_output_tokens: int, last: str
) -> None:
    """OpenAI's Responses stream has no `data: [DONE]` (chat's does): it ends at
    `response.completed` or `response.incomplete`."""
    body = {"model": GEN_MODEL, "instructions": INSTRUCTIONS, "input": question}
    body |= {"temperature": 0, "stream": True}
    blocks = _sse_blocks(f"{stack}/v1/responses", {**body, "max_output_tokens": max_output_tokens})
    assert blocks[-1].startswith(f"event: {last}\ndata: ")
    assert not any("[DONE]" in block for block in blocks)
    chat = {"model": GEN_MODEL, "messages": [{"role": "user", "content": QUESTION}]}
    chat_blocks = _sse_blocks(
        f"{stack}/v1/chat/completions", {**chat, "max_tokens": 3, "stream": True}
    )
    assert chat_blocks[-1] == "data: [DONE]"


class City(pydantic.BaseModel):
    name: str
    country: str


def test_parse_gives_a_validated_object(client) -> None:
    response = client.responses.parse(
        model=GEN_MODEL,
        input="Name a large city and its country, as JSON.",
        text_format=City,
        max_output_tokens=60,
        temperature=0,
    )
    assert isinstance(response.output_parsed, City)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"store": True}, "store"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"input": [{"type": "reasoning", "id": "r", "summary": []}]}, "input[0]"),
        ({"input": []}, "input"),
    ],
)
def test_what_is_not_served_is_a_clear_400(client, extra: dict, param: str) -> None:
    body = {"model": GEN_MODEL, "input": QUESTION, "max_output_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(**body)
    assert raised.value.body["param"] == param


ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
ADD_TOOL = {"type": "function", "name": "add", "description": "Add two integers", "parameters": ADD}


def test_a_forced_function_call_is_a_function_call_item(client) -> None:
    import json

    import jsonschema

    response = client.responses.create(
        model=GEN_MODEL,
        input="What is 2 plus 3?",
        tools=[ADD_TOOL],
        tool_choice={"type": "function", "name": "add"},
        max_output_tokens=60,
        temperature=0,
    )
    [call] = response.output
    assert call.type == "function_call" and call.name == "add" and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), ADD)
    # The call and its output go back as input items of the next request.
    follow = client.responses.create(
        model=GEN_MODEL,
        input=[
            {"role": "user", "content": "What is 2 plus 3?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": "add",
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "5"},
        ],
        tools=[ADD_TOOL],
        tool_choice="none",
        max_output_tokens=8,
        temperature=0,
    )
    assert follow.output[0].type == "message" and follow.output_text


def test_a_streamed_call_arrives_as_the_responses_stream_sends_one(client) -> None:
    import json

    with client.responses.stream(
        model=GEN_MODEL,
        input="What is 2 plus 3?",
        tools=[ADD_TOOL],
        tool_choice="required",
        max_output_tokens=60,
        temperature=0,
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    [call] = final.output
    assert call.type == "function_call" and set(json.loads(call.arguments)) == {"a", "b"}


def test_an_openai_agents_agent_on_the_responses_model(stack: str) -> None:
    """The OpenAI Agents SDK's default model kind, `OpenAIResponsesModel`, on /v1/responses."""
    from agents import OpenAIResponsesModel

    assert_agent_calls_add(
        lambda client: OpenAIResponsesModel(
            model=GEN_MODEL, openai_client=client(base_url=f"{stack}/v1", api_key="unused")
        )
    )
