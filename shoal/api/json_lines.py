"""JSON that every line splitter keeps on one line: SSE events and JSONL files.

JSON may carry NEL, LINE SEPARATOR and PARAGRAPH SEPARATOR raw inside a string, and
`str.splitlines` ends a line at each of them, as do the clients built on it (httpx's
`aiter_lines`, requests' `iter_lines(decode_unicode=True)`, a batch output file read with
`.splitlines()`): an event or a line would arrive cut in two. Outside a JSON string every
byte is ASCII, so these bytes are inside one, and their escapes mean the same.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["one_line"]

_encode = msgspec.json.Encoder().encode
_LINE_BREAKS_JSON_KEEPS = (
    (b"\xc2\x85", b"\\u0085"),
    (b"\xe2\x80\xa8", b"\\u2028"),
    (b"\xe2\x80\xa9", b"\\u2029"),
)


def one_line(value: Any) -> bytes:
    """`value` as JSON without a byte any line splitter ends a line at."""
    data = _encode(value)
    for raw, escaped in _LINE_BREAKS_JSON_KEEPS:
        if raw in data:
            data = data.replace(raw, escaped)
    return data
