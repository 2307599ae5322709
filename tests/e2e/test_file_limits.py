"""Limits on what the Files and Batches API stores and reads, through the official openai
SDK against real gateways with keys (on the shared stack's NATS and workers, with buckets
of their own): a batch line past `batches.max_line_bytes` fails validation naming the
line while a batch of lines up to it completes; uploads past a key's storage quota are
413 `storage_quota_exceeded` (nothing of them stored) on every gateway of the buckets,
other keys' files do not count, and deleting files makes room."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from shoal.api.keys import hash_key
from shoal.queue.embedded import EmbeddedNats
from tests.e2e.test_batches import embed_lines, jsonl, output_lines, wait_batch
from tests.helpers import MODEL, ShoalProcess, hears_of, start_gateway, wait_until

pytestmark = pytest.mark.slow

KEYS = {name: f"sk-shoal-test-limits-{name}-0123456789" for name in ("a", "b", "c")}
LINE_CAP = 64 * 1024
QUOTA = 300_000
ENV = {
    "SHOAL_AUTH__KEYS": json.dumps([{"name": n, "sha256": hash_key(k)} for n, k in KEYS.items()]),
    # Buckets of their own: the stack's gateway would otherwise run these batches.
    "SHOAL_NATS__FILES_BUCKET": "SHOAL_FILES_LIMITS",
    "SHOAL_NATS__BATCHES_BUCKET": "SHOAL_BATCHES_LIMITS",
    "SHOAL_BATCHES__MAX_LINE_BYTES": str(LINE_CAP),
    "SHOAL_BATCHES__QUOTA_BYTES_PER_KEY": str(QUOTA),
    "SHOAL_BATCHES__QUOTA_BYTES_TOTAL": str(10 * QUOTA),
}


class Gateway:
    def __init__(self, nats_url: str, data: Path) -> None:
        self.process: ShoalProcess
        self.process, self.base = start_gateway(nats_url, data, ENV)
        wait_until(lambda: hears_of(self.base, MODEL), 60, self.process, f"{MODEL} heard of")

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.base}/v1", api_key=KEYS[key], max_retries=0, timeout=60
        )


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("limits")


@pytest.fixture(scope="module")
def gateway(stack: str, session_nats: EmbeddedNats, data: Path) -> Iterator[Gateway]:
    gw = Gateway(session_nats.url, data)
    try:
        yield gw
    finally:
        gw.process.stop()


def line(custom_id: str, text: str) -> dict:
    body = {"model": MODEL, "input": text}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}


def test_a_line_past_the_cap_fails_validation_naming_it(gateway: Gateway) -> None:
    c = gateway.client("c")
    good = embed_lines(3, prefix="ok")
    too_long = line("long", "fish " * (LINE_CAP // 5))  # a line a little past the cap
    raw = jsonl(good[:2]) + jsonl([too_long]) + jsonl(good[2:])
    assert len(jsonl([too_long])) > LINE_CAP + 1
    uploaded = c.files.create(file=("long.jsonl", io.BytesIO(raw)), purpose="batch")
    batch = c.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    done = wait_batch(c, batch.id, timeout=60)
    assert done.status == "failed", done
    assert [(e.line, e.code) for e in done.errors.data] == [(3, "line_too_long")]
    assert str(LINE_CAP) in done.errors.data[0].message
    assert done.output_file_id is None
    assert [e["line"] for e in output_lines(c, done.error_file_id)] == [3]
    assert done.request_counts.completed == 0

    # Lines up to the cap are read and answered as ever.
    near = line("near", "")
    near["body"]["input"] = "fish " * ((LINE_CAP - len(json.dumps(near))) // 5)
    assert LINE_CAP - 5 < len(json.dumps(near)) <= LINE_CAP
    lines = [*good[:2], near, *good[2:]]
    uploaded = c.files.create(file=("near.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = c.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    done = wait_batch(c, batch.id, timeout=120)
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (4, 0)
    answered = {x["custom_id"] for x in output_lines(c, done.output_file_id)}
    assert answered == {"ok-0", "ok-1", "near", "ok-2"}


def upload(oai: openai.OpenAI, name: str, size: int) -> str:
    return oai.files.create(file=(name, io.BytesIO(b"x" * size)), purpose="batch").id


def refused(call) -> dict:
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    assert caught.value.status_code == 413, caught.value.response.text
    return caught.value.response.json()["error"]


def test_storage_quota_per_key_across_gateways(
    gateway: Gateway, session_nats: EmbeddedNats, data: Path
) -> None:
    a, b = gateway.client("a"), gateway.client("b")
    first = upload(a, "first.bin", 200_000)
    error = refused(lambda: upload(a, "second.bin", 150_000))
    assert error["code"] == "storage_quota_exceeded"
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "file"
    assert str(QUOTA) in error["message"] and "'a'" in error["message"]
    assert [f.filename for f in a.files.list().data] == ["first.bin"]
    # Refused as it streams in, and the client still reads the answer: a body far past
    # the quota gets the same 413 (the gateway stops storing at the quota).
    assert refused(lambda: upload(a, "huge.bin", 64 << 20))["code"] == "storage_quota_exceeded"
    upload(b, "b.bin", 250_000)  # a's files do not count against b

    # A gateway started now (as after a restart) reads what is stored from the bucket.
    other = Gateway(session_nats.url, data)
    try:
        a2 = other.client("a")
        refused(lambda: upload(a2, "second.bin", 150_000))
        a.files.delete(first)  # on the first gateway: frees the room on every one
        second = upload(a2, "second.bin", 150_000)
        filled = upload(a2, "filled.bin", QUOTA - 150_000)  # exactly the rest fits
        refused(lambda: upload(a, "one-more.bin", 1))
        # A new batch's output would be stored too: refused while the key's files fill it.
        error = refused(
            lambda: a.batches.create(
                input_file_id=filled, endpoint="/v1/embeddings", completion_window="24h"
            )
        )
        assert error["code"] == "storage_quota_exceeded"
        assert sorted(f.id for f in a2.files.list().data) == sorted([second, filled])
    finally:
        other.process.stop()
    # Refused uploads left nothing in the object store: only the files that were kept.
    kept = {p.name for p in (data / "objects" / "files").iterdir()}
    listed = {f.id for oai in (a, b, gateway.client("c")) for f in oai.files.list().data}
    assert kept == listed
