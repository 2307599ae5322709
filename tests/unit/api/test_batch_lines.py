"""Batch input checking, progress parts and the streamed multipart parser, without
servers."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from shoal.api.answer import BATCH_ENDPOINTS
from shoal.api.batches.lines import check_line, input_lines, validate
from shoal.api.batches.parts import NO_RESPONSE, LineOutcome, PartWriter, load_parts, render
from shoal.api.batches.runner import completion_window_seconds
from shoal.api.uploads import receive_upload
from shoal.compat.errors import InvalidRequestError, ModelNotFoundError, PayloadTooLargeError
from shoal.queue.objects import LocalObjectStore

EMBED = BATCH_ENDPOINTS["/v1/embeddings"]


def resolve(model: str, op: str) -> None:
    if model != "m":
        raise ModelNotFoundError(model)


def line(custom_id: str, **body) -> bytes:
    payload = {"model": "m", "input": "hi", **body}
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": payload}
    ).encode()


async def chunks(data: bytes, size: int):
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def test_input_lines_numbers_lines_across_chunk_edges_and_skips_blank_ones() -> None:
    data = b'{"a":1}\n\n{"b":2}\n{"c":3}'
    got = [(n, raw) async for n, raw in input_lines(chunks(data, 3), 100)]
    assert got == [(1, b'{"a":1}'), (3, b'{"b":2}'), (4, b'{"c":3}')]


def test_check_line_decodes_the_body_into_the_endpoint_request() -> None:
    checked = check_line(line("x"), "/v1/embeddings", EMBED, resolve)
    assert checked.custom_id == "x"
    assert checked.model == "m"
    assert checked.body.input == "hi"


async def test_validate_finds_every_duplicate_custom_id_with_its_line() -> None:
    data = b"\n".join([line("a"), line("b"), line("a"), line("c"), line("b"), line("a")])
    result = await validate(
        lambda: input_lines(chunks(data, 7), 1 << 20), "/v1/embeddings", EMBED, resolve, 100
    )
    assert result.total == 6
    assert [(e.line, e.code) for e in result.errors] == [
        (3, "duplicate_custom_id"),
        (5, "duplicate_custom_id"),
        (6, "duplicate_custom_id"),
    ]
    assert "line 1" in result.errors[0].message


async def test_validate_caps_reported_errors_but_counts_them_all() -> None:
    data = b"\n".join([b"{bad"] * 10)
    result = await validate(
        lambda: input_lines(chunks(data, 64), 1 << 20), "/v1/embeddings", EMBED, resolve, 3
    )
    assert result.error_count == 10
    assert [e.line for e in result.errors] == [1, 2, 3]


def test_render_writes_openai_output_lines() -> None:
    ok = json.loads(render("batch_1", LineOutcome(4, "x", 200, b'{"object":"list"}')))
    assert ok["custom_id"] == "x"
    assert ok["error"] is None
    assert ok["response"] == {
        "status_code": 200,
        "request_id": ok["id"],
        "body": {"object": "list"},
    }
    error = msgspec.json.encode({"code": "batch_expired", "message": "late"})
    expired = json.loads(render("batch_1", LineOutcome(5, "y", NO_RESPONSE, error)))
    assert expired["response"] is None
    assert expired["error"] == {"code": "batch_expired", "message": "late"}
    assert render("batch_1", LineOutcome(4, "x", 200, b"{}")) != render(
        "batch_2", LineOutcome(4, "x", 200, b"{}")
    )


def test_completion_windows() -> None:
    assert completion_window_seconds("24h") == 86_400
    assert completion_window_seconds("90s") == 90
    assert completion_window_seconds("0h") is None
    assert completion_window_seconds("1d") is None


def multipart_body(parts: list[tuple[str, str | None, bytes]], boundary: str = "BOUND") -> bytes:
    out = b""
    for name, filename, value in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        out += value + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


async def test_upload_streams_the_file_part_and_collects_fields() -> None:
    content = bytes(range(256)) * 1000
    body = multipart_body([("purpose", None, b"batch"), ("file", "a.jsonl", content)])
    fields: dict[str, str] = {}
    seen: list[int] = []

    async def store(filename: str, parts) -> tuple[str, bytes, str]:
        data = b""
        async for chunk in parts:
            seen.append(len(chunk))
            data += chunk
        return filename, data, fields["purpose"]

    stored = await receive_upload(
        chunks(body, 4096), "multipart/form-data; boundary=BOUND", store, 1 << 20, fields
    )
    assert stored == ("a.jsonl", content, "batch")
    assert max(seen) <= 4096  # handed on as it arrived, never gathered first


async def test_upload_refuses_non_multipart_truncated_and_too_large_bodies() -> None:
    async def store(filename: str, parts) -> int:
        return sum([len(c) async for c in parts])

    with pytest.raises(InvalidRequestError):
        await receive_upload(chunks(b"{}", 2), "application/json", store, 100, {})
    body = multipart_body([("file", "a", b"x" * 50)])
    with pytest.raises(InvalidRequestError):
        await receive_upload(
            chunks(body[:-20], 8), "multipart/form-data; boundary=BOUND", store, 100, {}
        )
    with pytest.raises(PayloadTooLargeError):
        await receive_upload(chunks(body, 8), "multipart/form-data; boundary=BOUND", store, 10, {})


class SlowStore(LocalObjectStore):
    """A real local store whose writes take a while, so a save can be cut off mid-write."""

    async def put_bytes(self, key: str, data: bytes) -> None:
        await asyncio.sleep(0.2)
        await super().put_bytes(key, data)


async def test_a_cancelled_save_loses_no_line_and_no_part_is_overwritten(tmp_path) -> None:
    store = SlowStore(tmp_path)
    writer = PartWriter(store, "batch_x", epoch=1)
    for index in range(3):
        writer.add(LineOutcome(index, f"c{index}", 200, b"{}"))
    saving = asyncio.create_task(writer.flush())
    await asyncio.sleep(0.05)
    saving.cancel()
    await asyncio.gather(saving, return_exceptions=True)
    assert [o.index for o in writer.pending] == [0, 1, 2]
    writer.add(LineOutcome(3, "c3", 200, b"{}"))
    assert await writer.flush()
    assert writer.pending == []
    saved = [o.index async for part in load_parts(store, "batch_x") for o in part]
    assert sorted(saved) == [0, 1, 2, 3]


async def test_a_failed_save_keeps_its_lines_pending(tmp_path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    writer = PartWriter(LocalObjectStore(blocked), "batch_y", epoch=1)
    writer.add(LineOutcome(0, "c0", 200, b"{}"))
    assert not await writer.flush()
    assert [o.index for o in writer.pending] == [0]
