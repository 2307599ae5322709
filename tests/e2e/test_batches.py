"""The Files and Batches API through the official openai SDK, against the real stack:
every line answered once with its custom_id, validation before anything runs, cancel."""

from __future__ import annotations

import base64
import io
import json
import time

import numpy as np
import pytest
from openai import OpenAI

from tests.helpers import GEN_MODEL, MODEL

pytestmark = pytest.mark.slow


def client(base: str) -> OpenAI:
    return OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def wait_batch(
    oai: OpenAI, batch_id: str, timeout: float = 200.0, until=None, what: str = "a final state"
):
    """The batch once `until` holds (default: it is final); its bound stays under the
    per-test timeout (300 s), so a batch that never gets there fails with this message."""
    done = until or (lambda b: b.status in ("completed", "failed", "cancelled", "expired"))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = oai.batches.retrieve(batch_id)
        if done(batch):
            return batch
        time.sleep(0.3)
    raise TimeoutError(
        f"batch {batch_id} did not reach {what} within {timeout:.0f}s: still {batch.status}, "
        f"{batch.request_counts}"
    )


def output_lines(oai: OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    text = oai.files.content(file_id).text
    return [json.loads(line) for line in text.splitlines() if line]


def submit(oai: OpenAI, lines: list[dict], endpoint: str, name: str = "input.jsonl"):
    uploaded = oai.files.create(file=(name, io.BytesIO(jsonl(lines))), purpose="batch")
    return oai.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h")


def as_floats(embedding: list[float] | str) -> np.ndarray:
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4")
    return np.asarray(embedding)


def embed_lines(n: int, prefix: str = "e") -> list[dict]:
    return [
        {
            "custom_id": f"{prefix}-{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": MODEL, "input": f"synthetic sentence number {i} about fish"},
        }
        for i in range(n)
    ]


def test_embeddings_batch_answers_every_line_once_equal_to_the_live_route(
    stack, session_dir
) -> None:
    oai = client(stack)
    lines = embed_lines(5000)
    batch = submit(oai, lines, "/v1/embeddings")
    assert batch.status == "validating"
    assert batch.request_counts is None or batch.request_counts.total in (0, 5000)
    done = wait_batch(oai, batch.id)
    assert done.status == "completed", done
    assert done.request_counts.total == 5000
    assert done.request_counts.completed == 5000
    assert done.request_counts.failed == 0
    assert done.error_file_id is None
    assert done.completed_at and done.in_progress_at and done.finalizing_at
    out = output_lines(oai, done.output_file_id)
    ids = [line["custom_id"] for line in out]
    assert len(ids) == 5000
    assert set(ids) == {line["custom_id"] for line in lines}
    by_id = {line["custom_id"]: line for line in out}
    sample = by_id["e-1234"]
    assert sample["error"] is None
    assert sample["response"]["status_code"] == 200
    assert sample["id"].startswith("batch_req_")
    vector = np.array(sample["response"]["body"]["data"][0]["embedding"])
    live = oai.embeddings.create(model=MODEL, input=lines[1234]["body"]["input"])
    assert np.allclose(vector, np.array(live.data[0].embedding), atol=1e-5)
    assert sample["response"]["body"]["usage"] == live.usage.model_dump()
    meta = oai.files.retrieve(done.output_file_id)
    assert meta.purpose == "batch_output"
    assert meta.bytes > 0
    progress = session_dir / "objects" / "batches" / done.id
    assert not [p for p in progress.rglob("*") if p.is_file()]  # saved parts cleaned up


def test_embeddings_lines_sent_together_are_each_answered_as_the_live_route(stack) -> None:
    """Consecutive lines share queued requests (packing); one line the live route refuses
    gets its own 400 and its neighbours are still answered, each with its own usage."""
    oai = client(stack)
    long_text = "word " * 2000
    bodies = [
        {"model": MODEL, "input": ["two inputs", "in one line"]},
        {"model": MODEL, "input": "one input", "user": "someone"},
        {"model": MODEL, "input": long_text, "truncate": False},
        {"model": MODEL, "input": "a short one", "dimensions": 8},
        {"model": MODEL, "input": "base64 please", "encoding_format": "base64"},
        {"model": MODEL, "input": [101, 7592, 102]},
        {"model": MODEL, "input": "the last one"},
    ]
    lines = [
        {"custom_id": f"p-{i}", "method": "POST", "url": "/v1/embeddings", "body": body}
        for i, body in enumerate(bodies)
    ]
    done = wait_batch(oai, submit(oai, lines, "/v1/embeddings").id, timeout=120)
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (6, 1)
    answered = {line["custom_id"]: line for line in output_lines(oai, done.output_file_id)}
    failed = output_lines(oai, done.error_file_id)
    assert [line["custom_id"] for line in failed] == ["p-2"]
    assert failed[0]["response"]["status_code"] == 400
    assert "input" in failed[0]["response"]["body"]["error"]["message"]
    for i, body in enumerate(bodies):
        if i == 2:
            continue
        got = answered[f"p-{i}"]["response"]["body"]
        extra = {k: v for k, v in body.items() if k not in ("model", "input", "encoding_format")}
        live = oai.embeddings.create(
            model=MODEL,
            input=body["input"],
            encoding_format=body.get("encoding_format", "float"),
            extra_body=extra or None,
        )
        assert got["usage"] == live.usage.model_dump()
        assert [d["index"] for d in got["data"]] == [d.index for d in live.data]
        for mine, theirs in zip(got["data"], live.data, strict=True):
            assert np.allclose(as_floats(mine["embedding"]), as_floats(theirs.embedding), atol=1e-5)


def test_chat_batch_of_500_lines(stack) -> None:
    oai = client(stack)
    lines = [
        {
            "custom_id": f"chat-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": GEN_MODEL,
                "max_tokens": 4,
                "temperature": 0,
                "messages": [{"role": "user", "content": f"Say the number {i}."}],
            },
        }
        for i in range(500)
    ]
    batch = submit(oai, lines, "/v1/chat/completions")
    done = wait_batch(oai, batch.id, timeout=240)
    assert done.status == "completed", done
    assert done.request_counts.completed == 500
    assert done.model == GEN_MODEL
    out = output_lines(oai, done.output_file_id)
    assert sorted(line["custom_id"] for line in out) == sorted(f"chat-{i}" for i in range(500))
    body = out[0]["response"]["body"]
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] <= 4


def test_validation_fails_the_batch_before_anything_runs_naming_each_line(stack) -> None:
    oai = client(stack)
    good = embed_lines(3, prefix="v")
    raw = (
        jsonl(good[:1])
        + b"{not json\n"  # line 2
        + jsonl(good[:1])  # line 3: duplicate custom_id of line 1
        + jsonl([{**good[1], "url": "/v1/chat/completions"}])  # line 4
        + jsonl([{**good[2], "body": {"model": "no-such-model", "input": "x"}}])  # line 5
        + jsonl([{"custom_id": "v-9", "method": "POST", "url": "/v1/embeddings"}])  # line 6
    )
    uploaded = oai.files.create(file=("bad.jsonl", io.BytesIO(raw)), purpose="batch")
    batch = oai.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    done = wait_batch(oai, batch.id, timeout=60)
    assert done.status == "failed"
    assert done.failed_at
    assert done.output_file_id is None
    by_line = {e.line: e.code for e in done.errors.data}
    assert by_line == {
        2: "invalid_json_line",
        3: "duplicate_custom_id",
        4: "invalid_url",
        5: "model_not_found",
        6: "missing_required_parameter",
    }
    errors = output_lines(oai, done.error_file_id)
    assert [e["line"] for e in errors] == [2, 3, 4, 5, 6]
    assert done.request_counts.completed == 0


def test_create_refuses_a_bad_endpoint_or_file_at_once(stack) -> None:
    import openai

    oai = client(stack)
    uploaded = oai.files.create(
        file=("one.jsonl", io.BytesIO(jsonl(embed_lines(1)))), purpose="batch"
    )
    with pytest.raises(openai.BadRequestError) as bad_endpoint:
        oai.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/moderations", completion_window="24h"
        )
    assert bad_endpoint.value.body["param"] == "endpoint"
    with pytest.raises(openai.BadRequestError) as missing:
        oai.batches.create(
            input_file_id="file-nope", endpoint="/v1/embeddings", completion_window="24h"
        )
    assert missing.value.body["code"] == "file_not_found"
    with pytest.raises(openai.NotFoundError):
        oai.batches.retrieve("batch_nope")


def test_cancel_mid_run_writes_partial_output(stack) -> None:
    oai = client(stack)
    lines = embed_lines(40_000, prefix="c")
    batch = submit(oai, lines, "/v1/embeddings")
    wait_batch(oai, batch.id, until=lambda b: (b.request_counts.completed or 0) > 500)
    cancelling = oai.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    done = wait_batch(oai, batch.id, timeout=120)
    assert done.status == "cancelled"
    assert done.cancelled_at
    assert 500 < done.request_counts.completed < 40_000
    out = output_lines(oai, done.output_file_id)
    ids = [line["custom_id"] for line in out]
    assert len(ids) == len(set(ids)) == done.request_counts.completed


def test_files_list_retrieve_delete(stack) -> None:
    import openai

    oai = client(stack)
    data = jsonl(embed_lines(2))
    uploaded = oai.files.create(file=("two.jsonl", io.BytesIO(data)), purpose="batch")
    assert uploaded.bytes == len(data)
    assert uploaded.filename == "two.jsonl"
    assert uploaded.purpose == "batch"
    assert oai.files.retrieve(uploaded.id).id == uploaded.id
    assert oai.files.content(uploaded.id).content == data
    listed = oai.files.list(purpose="batch")
    assert uploaded.id in [f.id for f in listed.data]
    deleted = oai.files.delete(uploaded.id)
    assert deleted.deleted is True
    with pytest.raises(openai.NotFoundError):
        oai.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        oai.files.content(uploaded.id)


def test_batches_list_paginates_newest_first(stack) -> None:
    oai = client(stack)
    made = [submit(oai, embed_lines(2, prefix=f"p{i}"), "/v1/embeddings").id for i in range(3)]
    first = oai.batches.list(limit=2)
    assert [b.id for b in first.data] == made[::-1][:2]
    assert first.has_more
    second = oai.batches.list(limit=2, after=first.data[-1].id)
    assert second.data[0].id == made[0]
    for batch_id in made:
        wait_batch(oai, batch_id, timeout=60)


def test_a_batch_past_its_window_expires_with_every_line_accounted_once(stack) -> None:
    oai = client(stack)
    lines = embed_lines(40_000, prefix="x")
    uploaded = oai.files.create(file=("late.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    # `<n>s` windows are a Shoal extension (OpenAI accepts only 24h).
    batch = oai.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="4s"
    )
    done = wait_batch(oai, batch.id, timeout=120)
    assert done.status == "expired"
    assert done.expired_at
    counts = done.request_counts
    assert counts.completed + counts.failed == 40_000
    assert 0 < counts.completed < 40_000
    answered = output_lines(oai, done.output_file_id)
    expired = output_lines(oai, done.error_file_id)
    assert len(answered) == counts.completed
    assert {e["error"]["code"] for e in expired} == {"batch_expired"}
    assert all(e["response"] is None for e in expired)
    ids = [line["custom_id"] for line in answered + expired]
    assert len(ids) == len(set(ids)) == 40_000


def test_a_1_gib_upload_streams_through_with_bounded_gateway_memory(session_nats, tmp_path) -> None:
    import hashlib

    import httpx
    import psutil

    from tests.helpers import start_gateway

    source = tmp_path / "big.jsonl"
    block = (b'{"custom_id": "pad", "method": "POST", "url": "/v1/embeddings"}\n' * 16384)[
        : 1 << 20
    ]
    digest = hashlib.sha256()
    with open(source, "wb") as out:
        for _ in range(1024):
            out.write(block)
            digest.update(block)
    gateway, base = start_gateway(session_nats.url, tmp_path)
    try:
        process = psutil.Process(gateway.pid)
        before = process.memory_info().rss
        peak = before
        oai = client(base)
        with open(source, "rb") as handle:
            uploaded = oai.files.create(file=("big.jsonl", handle), purpose="batch")
        peak = max(peak, process.memory_info().rss)
        assert uploaded.bytes == 1 << 30
        downloaded = hashlib.sha256()
        size = 0
        with httpx.stream("GET", f"{base}/v1/files/{uploaded.id}/content", timeout=300) as got:
            assert got.status_code == 200
            for chunk in got.iter_bytes():
                downloaded.update(chunk)
                size += len(chunk)
        peak = max(peak, process.memory_info().rss)
        assert size == 1 << 30
        assert downloaded.hexdigest() == digest.hexdigest()
        # Streamed both ways: the gateway never held the file (1024 MiB) in memory.
        assert peak - before < 200 << 20, f"gateway grew by {(peak - before) >> 20} MiB"
        oai.files.delete(uploaded.id)
    finally:
        gateway.stop()
