"""A streamed event is one `data:` line, and a batch output line one line, for every way
clients split text into lines: text a model generates (or a custom_id) may hold NEL, LINE
SEPARATOR or PARAGRAPH SEPARATOR, which JSON carries raw and `str.splitlines` (httpx's
`aiter_lines`, a batch output file read with `.splitlines()`) ends a line at. A 60-minute
soak lost a chat that way (perf/results/soak-20261206-225755)."""

from __future__ import annotations

import asyncio
import json

import msgspec
from httpx._decoders import LineDecoder  # what `Response.aiter_lines` splits with

from shoal.api.answer import _sse
from shoal.api.batches.parts import NO_RESPONSE, LineOutcome, render
from shoal.compat.errors import InvalidRequestError

TEXT = "one\x85two\u2028three\u2029four\x0bfive\x1csix é"


class Event(msgspec.Struct):
    content: str


async def _events():
    yield Event(TEXT)
    raise InvalidRequestError(f"failed on {TEXT}")


def test_each_event_is_one_line_to_str_splitlines_and_means_the_same() -> None:
    async def stream() -> bytes:
        return b"".join([part async for part in _sse(_events(), done=True)])

    raw = asyncio.run(stream())
    decoder = LineDecoder()
    lines = [line for line in decoder.decode(raw.decode()) + decoder.flush() if line]
    assert lines[-1] == "data: [DONE]" and len(lines) == 3, lines
    assert json.loads(lines[0].removeprefix("data: ")) == {"content": TEXT}
    error = json.loads(lines[1].removeprefix("data: "))["error"]
    assert error["message"] == f"failed on {TEXT}"


def test_each_batch_output_line_is_one_line_to_str_splitlines_and_means_the_same() -> None:
    answered = LineOutcome(0, f"id {TEXT}", 200, json.dumps({"content": TEXT}).encode())
    expired = LineOutcome(1, TEXT, NO_RESPONSE, json.dumps({"code": "x", "message": TEXT}).encode())
    for outcome in (answered, expired):
        text = render("batch_1", outcome).decode()
        assert text.endswith("\n") and text.splitlines() == [text[:-1]]
        line = json.loads(text)
        assert line["custom_id"] == outcome.custom_id
        body = (line["response"] or {}).get("body") or line["error"]
        assert body == json.loads(outcome.body)
