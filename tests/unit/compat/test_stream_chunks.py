"""The streamed chunks of chat and completions: never two entries for one choice in a
chunk (OpenAI sends one delta per choice per chunk, and clients that read
`chunk.choices[0]` lose the rest), over text, drafted steps of several tokens, held tool
calls, `n` > 1 and logprobs. The generation is a scripted `DeltaStream` (a Protocol Shoal
owns), so only the renderers run."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import msgspec
import pytest

from shoal.compat.openai.chat import ChatCompletionChunk, ChatCompletionRequest
from shoal.compat.openai.completions import CompletionChunk, CompletionRequest
from shoal.compat.openai.generation import one_entry_per_choice
from shoal.queue.messages import ChoiceDelta, TokenLogprob

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
CALL = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'


class Scripted:
    """A generation that yields the given steps (lists of deltas), then its usage."""

    def __init__(self, steps: list[list[ChoiceDelta]], choices: int = 1) -> None:
        self.steps = steps
        self.model = "m"
        self.prompt_tokens = 3
        self.completion_tokens = 5
        self.choices = choices
        self.prompts = ["P"] * choices

    async def __aiter__(self) -> AsyncIterator[list[ChoiceDelta]]:
        for step in self.steps:
            yield step


def _lp(token: str) -> TokenLogprob:
    return TokenLogprob(token=token, logprob=-0.5, bytes=list(token.encode()))


def _d(index: int, text: str, finish: str = "", logprobs: bool = False) -> ChoiceDelta:
    lps = [_lp(text)] if logprobs and text else []
    return ChoiceDelta(index=index, text=text, finish_reason=finish, logprobs=lps)


async def _chat_chunks(body: dict, steps: list[list[ChoiceDelta]]) -> list[ChatCompletionChunk]:
    request = msgspec.convert({"model": "m", "stream": True, **body}, ChatCompletionRequest)
    return [c async for c in request.events(Scripted(steps, request.n))]


def _assert_one_entry_per_choice(chunks) -> None:
    for chunk in chunks:
        indices = [c.index for c in chunk.choices]
        assert len(indices) == len(set(indices)), indices


ASK = [{"role": "user", "content": "weather?"}]
# Each case: the request, the engine's steps. Two deltas of one choice in a step stand
# for anything upstream that sends a choice twice in one step (a drafted step's tokens
# arriving as separate deltas); the builder must still split them.
CASES = {
    "text": ({"messages": ASK}, [[_d(0, "Hel")], [_d(0, "lo", "stop")]]),
    "drafted step": ({"messages": ASK}, [[_d(0, "Hel"), _d(0, "lo, "), _d(0, "you", "stop")]]),
    "n=3": (
        {"messages": ASK, "n": 3},
        [
            [_d(0, "a"), _d(1, "b"), _d(2, "c")],
            [_d(0, "x", "stop"), _d(2, "z", "stop")],
            [_d(1, "y"), _d(1, "", "length")],
        ],
    ),
    "logprobs": (
        {"messages": ASK, "logprobs": True, "top_logprobs": 1, "n": 2},
        [
            [_d(0, "a", logprobs=True), _d(0, "b", logprobs=True), _d(1, "c", logprobs=True)],
            [_d(0, "", "stop"), _d(1, "d", "stop", logprobs=True)],
        ],
    ),
    "forced call": (
        {"messages": ASK, "tools": TOOLS, "tool_choice": "required"},
        [[_d(0, CALL[:20])], [_d(0, CALL[20:], "stop")]],
    ),
    "forced calls, n=2, in one step": (
        {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "n": 2},
        [[_d(0, CALL, "stop"), _d(1, CALL, "stop")]],
    ),
    "auto, text": (
        {"messages": ASK, "tools": TOOLS},
        [[_d(0, "It is")], [_d(0, " sunny", "stop")]],
    ),
}


@pytest.mark.parametrize("case", CASES)
async def test_chat_chunks_carry_at_most_one_entry_per_choice(case: str) -> None:
    body, steps = CASES[case]
    chunks = await _chat_chunks(body, steps)
    _assert_one_entry_per_choice(chunks)
    # Nothing lost: each choice's text (or call) and finish reason as the steps gave them.
    n = body.get("n", 1)
    texts, arguments, finishes = [""] * n, [""] * n, [None] * n
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            arguments[c.index] += "".join(t.function.arguments for t in c.delta.tool_calls or [])
            finishes[c.index] = c.finish_reason or finishes[c.index]
    if "call" in case:
        assert texts == [""] * n and finishes == ["tool_calls"] * n
        assert [json.loads(a) for a in arguments] == [{"city": "Oslo"}] * n
        return
    assert texts == ["".join(d.text for s in steps for d in s if d.index == i) for i in range(n)]
    assert finishes == [
        next(d.finish_reason for s in steps for d in s if d.index == i and d.finish_reason)
        for i in range(n)
    ]


@pytest.mark.parametrize("n", [1, 2])
async def test_a_held_call_goes_out_as_three_consecutive_chunks(n: int) -> None:
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "n": n}
    steps = [[_d(i, CALL[:20]) for i in range(n)], [_d(i, CALL[20:], "stop") for i in range(n)]]
    chunks = await _chat_chunks(body, steps)
    _assert_one_entry_per_choice(chunks)
    for i in range(n):
        # What a reader of one choice sees, chunk by chunk (the role chunk first).
        seen = [c for chunk in chunks for c in chunk.choices if c.index == i][1:]
        assert [s.finish_reason for s in seen] == [None, None, "tool_calls"]
        head, body_, last = seen
        [opened] = head.delta.tool_calls
        assert opened.id.startswith("call_") and opened.function.name == "get_weather"
        assert opened.function.arguments == ""
        [arguments] = body_.delta.tool_calls
        assert arguments.id is None and json.loads(arguments.function.arguments) == {"city": "Oslo"}
        assert last.delta.tool_calls is None


async def test_a_reader_of_choices_0_gets_the_whole_call() -> None:
    """What LangChain and a plain SDK loop read: `chunk.choices[0]` of each chunk."""
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required"}
    chunks = await _chat_chunks(body, [[_d(0, CALL, "stop")]])
    arguments, finish = "", None
    for chunk in chunks:
        first = chunk.choices[0]
        for call in first.delta.tool_calls or []:
            arguments += call.function.arguments or ""
        finish = first.finish_reason or finish
    assert json.loads(arguments) == {"city": "Oslo"} and finish == "tool_calls"


async def test_completion_chunks_carry_at_most_one_entry_per_choice() -> None:
    request = msgspec.convert(
        {"model": "m", "prompt": "P", "stream": True, "n": 2, "echo": True, "logprobs": 1},
        CompletionRequest,
    )
    steps = [
        [_d(0, "a", logprobs=True), _d(0, "b", logprobs=True), _d(1, "c", logprobs=True)],
        [_d(1, "d", "stop", logprobs=True), _d(0, "", "length")],
    ]
    chunks: list[CompletionChunk] = [c async for c in request.events(Scripted(steps, 2))]
    _assert_one_entry_per_choice(chunks)
    texts = ["", ""]
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == ["Pab", "Pcd"]


def test_the_builder_splits_where_an_index_repeats_and_keeps_order() -> None:
    class E(msgspec.Struct):
        index: int
        tag: str

    entries = [E(0, "a"), E(1, "b"), E(0, "c"), E(0, "d"), E(1, "e")]
    groups = list(one_entry_per_choice(entries))
    assert [[e.tag for e in g] for g in groups] == [["a", "b"], ["c"], ["d", "e"]]
    assert list(one_entry_per_choice([])) == []
