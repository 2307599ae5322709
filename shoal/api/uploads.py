"""multipart/form-data parsed as it streams in, so a 1 GiB upload never sits in memory.

Small fields are collected; the file part is handed, chunk by chunk, to a consumer that
streams it on (to the object store).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import multipart

from ..compat.errors import InvalidRequestError, PayloadTooLargeError

__all__ = ["receive_upload"]

T = TypeVar("T")

_MAX_FIELD_BYTES = 64 * 1024


async def receive_upload(
    body: AsyncIterator[bytes],
    content_type: str,
    store_file: Callable[[str, AsyncIterator[bytes]], Awaitable[T]],
    max_file_bytes: int,
    fields: dict[str, str],
    file_field: str = "file",
) -> T | None:
    """Parse the body: small fields into `fields` (those before the file part are there
    when `store_file(filename, chunks)` is called to consume the file part).

    Raises:
        InvalidRequestError: not multipart/form-data, or malformed.
        PayloadTooLargeError: the file is larger than `max_file_bytes`.
    """
    kind, options = multipart.parse_options_header(content_type or "")
    if kind != "multipart/form-data" or not options.get("boundary"):
        raise InvalidRequestError(
            "Uploads must be multipart/form-data with a 'file' part", code="invalid_content_type"
        )
    parser = multipart.PushMultipartParser(options["boundary"], max_segment_count=16)
    events = _events(parser, body)
    stored: T | None = None
    try:
        async for event in events:
            if not isinstance(event, multipart.MultipartSegment):
                continue
            if event.name == file_field and event.filename is not None:
                if stored is not None:
                    raise InvalidRequestError("Only one file per upload", param=file_field)
                stored = await store_file(
                    event.filename, _limited(_segment_data(events), max_file_bytes)
                )
            else:
                value = bytearray()
                async for chunk in _segment_data(events):
                    value += chunk
                    if len(value) > _MAX_FIELD_BYTES:
                        raise InvalidRequestError(f"Field '{event.name}' is too large")
                fields[event.name] = value.decode("utf-8", "replace")
    except multipart.MultipartError as exc:
        raise InvalidRequestError(f"The multipart body is malformed: {exc}") from exc
    return stored


async def _events(parser: multipart.PushMultipartParser, body: AsyncIterator[bytes]):
    async for chunk in body:
        for event in parser.parse(chunk):
            yield event
    parser.close()  # raises unless the final boundary was seen


async def _segment_data(events) -> AsyncIterator[bytes]:
    """The current part's bytes, up to its end (the parser's `None`)."""
    async for event in events:
        if event is None:
            return
        yield bytes(event)


async def _limited(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"The file is larger than the limit of {limit} bytes")
        yield chunk
