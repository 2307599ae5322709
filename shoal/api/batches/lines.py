"""Reading and checking a batch input file, line by line, streamed.

`input_lines` and `check_line` are the one definition of a valid line; validation runs
them over the whole file before anything is queued, and the runner runs them again to
decode each line it sends, so the two can never disagree.

A line is held as the pieces of the chunks it spans and joined once, when its end is
found, so each byte is copied a bounded number of times however long the line. A line
longer than `max_line_bytes` is not held at all: its pieces are dropped as soon as it
passes the cap, the rest of it is skipped up to its newline, and it is reported once (as
`TooLong`), so memory per line stays under the cap plus one chunk whatever the file holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

import msgspec
import numpy as np

from ...compat.errors import ShoalError
from ...compat.openai.batches import BatchError, BatchInputLine
from ..answer import Endpoint

__all__ = [
    "CheckedLine",
    "InputLine",
    "LineError",
    "TooLong",
    "Validation",
    "check_line",
    "custom_id_of",
    "input_lines",
    "validate",
]

_decode_line = msgspec.json.Decoder(BatchInputLine).decode


class LineError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


class CheckedLine(NamedTuple):
    custom_id: str
    body: Any
    """The decoded request struct of the batch's endpoint."""
    model: str


class TooLong(NamedTuple):
    """In place of a line longer than `limit` bytes, which was not kept."""

    limit: int


class InputLine(NamedTuple):
    number: int
    """The line's number in the file, from 1 (blank lines are counted, not yielded)."""
    raw: bytes | TooLong
    """The line without its newline."""


async def input_lines(
    chunks: AsyncIterator[bytes], max_line_bytes: int
) -> AsyncIterator[InputLine]:
    """Every non-blank line of the file, in order; a line longer than `max_line_bytes`
    (blank or not: it is not kept to look at) comes as `TooLong`."""
    pieces: list[bytes] = []  # the current line so far, joined once its end is found
    held = 0  # bytes in `pieces`, or in the line being skipped
    number = 0
    too_long = TooLong(max_line_bytes)
    async for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            number += 1
            length = held + end - start
            if length > max_line_bytes:
                yield InputLine(number, too_long)
            else:
                line = b"".join([*pieces, chunk[start:end]]) if pieces else chunk[start:end]
                if line.strip():
                    yield InputLine(number, line)
            pieces.clear()
            held = 0
            start = end + 1
        if start < len(chunk):
            held += len(chunk) - start
            if held <= max_line_bytes:
                pieces.append(chunk[start:] if start else chunk)
            else:
                pieces.clear()  # past the cap: the rest is only counted up to its end
    if held > max_line_bytes:
        yield InputLine(number + 1, too_long)
    elif held:
        line = b"".join(pieces)
        if line.strip():
            yield InputLine(number + 1, line)


def custom_id_of(raw: bytes | TooLong) -> str:
    """The line's `custom_id`, or "" when it has none (or cannot be read)."""
    if isinstance(raw, TooLong):
        return ""
    try:
        return str(msgspec.json.decode(raw).get("custom_id", ""))
    except (msgspec.DecodeError, AttributeError, RecursionError):
        return ""


def check_line(
    raw: bytes | TooLong, url: str, endpoint: Endpoint, resolve: Callable[[str, str], object]
) -> CheckedLine:
    """Raises LineError naming what is wrong with the line."""
    if isinstance(raw, TooLong):
        raise LineError(
            "line_too_long", f"The line is longer than the limit of {raw.limit} bytes per line"
        )
    try:
        line = _decode_line(raw)
    except msgspec.ValidationError as exc:
        raise LineError("missing_required_parameter", f"Invalid line: {exc}") from None
    except msgspec.DecodeError as exc:
        raise LineError("invalid_json_line", f"The line is not valid JSON: {exc}") from None
    except RecursionError:  # msgspec's bound on nesting
        raise LineError("invalid_json_line", "The line is nested too deeply") from None
    if not line.custom_id:
        raise LineError("missing_required_parameter", "'custom_id' is empty", "custom_id")
    if line.method.upper() != "POST":
        raise LineError("invalid_method", f"'method' must be POST, not {line.method!r}", "method")
    if line.url != url:
        raise LineError(
            "invalid_url", f"'url' is {line.url!r} but the batch's endpoint is {url!r}", "url"
        )
    try:
        body = msgspec.json.decode(line.body, type=endpoint.request)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise LineError("invalid_request", f"Invalid body: {exc}", "body") from None
    except RecursionError:
        raise LineError("invalid_request", "The body is nested too deeply", "body") from None
    if endpoint.streams and getattr(body, "stream", False):
        raise LineError("invalid_request", "'stream' is not supported in batches", "body.stream")
    model = body.model  # type: ignore[attr-defined]
    try:
        resolve(model, endpoint.op)
    except ShoalError as exc:
        code = "model_not_found" if exc.status_code == 404 else "invalid_request"
        raise LineError(code, exc.message, "body.model") from None
    return CheckedLine(line.custom_id, body, model)


class Validation(NamedTuple):
    total: int
    errors: list[BatchError]
    """The first `max_errors` problems, by line."""
    error_count: int
    models: set[str]


def _hash(custom_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(custom_id.encode(), digest_size=8).digest(), "little")


async def validate(
    lines: Callable[[], AsyncIterator[InputLine]],
    url: str,
    endpoint: Endpoint,
    resolve: Callable[[str, str], object],
    max_errors: int,
) -> Validation:
    """Check every line and that `custom_id`s are unique. Memory per line is 12 bytes
    (a 64-bit hash of the id and the line number), so 10^7 lines fit easily; hash
    collisions are confirmed on a second pass before reporting a duplicate."""
    errors: list[BatchError] = []
    count = 0
    total = 0
    models: set[str] = set()
    hashes: list[int] = []
    numbers: list[int] = []
    async for number, raw in lines():
        total += 1
        try:
            checked = check_line(raw, url, endpoint, resolve)
        except LineError as exc:
            count += 1
            if len(errors) < max_errors:
                errors.append(
                    BatchError(code=exc.code, message=exc.message, param=exc.param, line=number)
                )
            continue
        models.add(checked.model)
        hashes.append(_hash(checked.custom_id))
        numbers.append(number)
    suspects = _colliding(np.array(hashes, dtype=np.uint64), np.array(numbers, dtype=np.int64))
    if suspects:
        first_seen: dict[str, int] = {}
        async for number, raw in lines():
            if number not in suspects:
                continue
            custom_id = _decode_line(raw).custom_id
            if custom_id in first_seen:
                count += 1
                if len(errors) < max_errors:
                    errors.append(
                        BatchError(
                            code="duplicate_custom_id",
                            message=(
                                f"custom_id {custom_id!r} is also on line {first_seen[custom_id]}"
                            ),
                            param="custom_id",
                            line=number,
                        )
                    )
            else:
                first_seen[custom_id] = number
    errors.sort(key=lambda e: e.line or 0)
    return Validation(total, errors, count, models)


def _colliding(hashes: np.ndarray, numbers: np.ndarray) -> set[int]:
    """Line numbers whose id hash occurs more than once."""
    if len(hashes) < 2:
        return set()
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    same = ordered[1:] == ordered[:-1]
    mask = np.zeros(len(hashes), dtype=bool)
    mask[1:] |= same
    mask[:-1] |= same
    return set(numbers[order[mask]].tolist())
