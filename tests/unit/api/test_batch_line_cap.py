"""The cap on a batch input line: a longer line is one `line_too_long` error naming its
line, read with memory bounded by the cap and each byte of the file copied a bounded
number of times (not the whole line again for every chunk), in validation and in the
runner's reading alike (they share `input_lines` and `check_line`)."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from shoal.api.answer import BATCH_ENDPOINTS
from shoal.api.batches.lines import (
    LineError,
    TooLong,
    check_line,
    custom_id_of,
    input_lines,
    validate,
)
from shoal.compat.errors import ModelNotFoundError

EMBED = BATCH_ENDPOINTS["/v1/embeddings"]
CAP = 64 * 1024
CHUNK = 16 * 1024


def resolve(model: str, op: str) -> None:
    if model != "m":
        raise ModelNotFoundError(model)


def line_of(custom_id: str, size: int) -> bytes:
    """A valid embeddings line of exactly `size` bytes."""

    def build(pad: int) -> bytes:
        body = {"model": "m", "input": "x" * pad}
        return json.dumps(
            {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}
        ).encode()

    short = build(0)
    assert size >= len(short)
    made = build(size - len(short))
    assert len(made) == size
    return made


class Counted(bytes):
    """A chunk that counts the bytes produced by concatenating it with something (`a +
    chunk`, `chunk + a`) or slicing it: the copies a line reader makes of its input."""

    copied = 0

    def __add__(self, other: bytes) -> bytes:  # type: ignore[override]
        Counted.copied += len(self) + len(other)
        return bytes(self) + bytes(other)

    def __radd__(self, other: bytes) -> bytes:
        Counted.copied += len(self) + len(other)
        return bytes(other) + bytes(self)

    def __getitem__(self, index):  # type: ignore[override]
        part = bytes.__getitem__(self, index)
        if isinstance(part, bytes):
            Counted.copied += len(part)
        return part


class Source:
    """A file made of `pieces` (bytes, or an int: that many 'x' bytes with no newline),
    served in `CHUNK`-byte chunks made as they are read, so the file itself is never in
    memory."""

    def __init__(self, *pieces: bytes | int) -> None:
        self.pieces = pieces
        self.size = sum(p if isinstance(p, int) else len(p) for p in pieces)

    async def chunks(self):
        pending = b""
        for piece in self.pieces:
            left = piece if isinstance(piece, int) else 0
            if isinstance(piece, bytes):
                pending += piece
            while len(pending) >= CHUNK or left:
                if len(pending) < CHUNK:
                    take = min(left, CHUNK - len(pending))
                    pending += b"x" * take
                    left -= take
                if len(pending) >= CHUNK:
                    yield Counted(pending[:CHUNK])
                    pending = pending[CHUNK:]
        while pending:
            yield Counted(pending[:CHUNK])
            pending = pending[CHUNK:]


async def test_a_line_past_the_cap_is_one_error_read_with_bounded_memory_and_copies() -> None:
    long_line = 64 * CAP  # 4 MiB in one line, sixty-four times the cap
    source = Source(
        line_of("a", 100) + b"\n",  # 1
        long_line,  # 2
        b"\n" + line_of("b", 100) + b"\n\n",  # 3, then a blank line 4
        line_of("c", CAP) + b"\n",  # 5: exactly the cap, fine
        line_of("d", CAP + 1) + b"\n",  # 6: one byte over
        line_of("e", 100) + b"\n",  # 7
        b'{"custom_id": "f", ',  # 8: too long, and the file's last line (no newline)
        long_line,
    )
    Counted.copied = 0
    tracemalloc.start()
    try:
        result = await validate(
            lambda: input_lines(source.chunks(), CAP), "/v1/embeddings", EMBED, resolve, 100
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert result.total == 7
    assert [(e.line, e.code) for e in result.errors] == [
        (2, "line_too_long"),
        (6, "line_too_long"),
        (8, "line_too_long"),
    ]
    assert str(CAP) in result.errors[0].message
    assert result.error_count == 3
    assert result.models == {"m"}
    # One line held at a time, never more than the cap of it (plus the chunk being read
    # and its joined copy): not the 4 MiB line.
    assert peak < 3 * CAP + 4 * CHUNK + 256 * 1024, f"peak {peak} bytes"
    # Each byte is copied out of the chunks at most once: re-joining a growing line with
    # every new chunk would copy this line's bytes about 128 times over.
    assert Counted.copied <= source.size, f"{Counted.copied} bytes copied of {source.size}"


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8, 13, 64])
async def test_input_lines_agrees_with_a_plain_split_at_every_chunk_size(chunk: int) -> None:
    cap = 8
    data = b"a\n\n12345678\n123456789\n  \n" + b"y" * 30 + b"\nlast"
    expected = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if len(raw) > cap:
            expected.append((number, TooLong(cap)))
        elif raw.strip():
            expected.append((number, raw))

    async def chunks():
        for start in range(0, len(data), chunk):
            yield data[start : start + chunk]

    got = [(n, raw) async for n, raw in input_lines(chunks(), cap)]
    assert got == expected
    assert got[-1] == (7, b"last")


def test_the_runner_answers_a_too_long_line_with_a_line_error() -> None:
    """The runner re-reads lines with `input_lines`: a line too long for the cap it runs
    with (lowered since validation) is a 400 for that line, its place kept."""
    with pytest.raises(LineError) as caught:
        check_line(TooLong(CAP), "/v1/embeddings", EMBED, resolve)
    assert caught.value.code == "line_too_long"
    assert str(CAP) in caught.value.message
    assert custom_id_of(TooLong(CAP)) == ""
    assert custom_id_of(line_of("z", 100)) == "z"
