"""Items and replies too large for one NATS message travel through the object store
(local disk, or S3 on a real seaweedfs server): a 3 MiB request is served correctly and
its stored payloads are gone afterwards; a dead store is a 503 at once, never a hang.

The nats-server here takes messages of at most 256 KiB, so an item or reply larger than
that can only arrive through the store: a pass proves the offload, not just the answer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from openai import OpenAI

from shoal.queue.embedded import EmbeddedNats
from tests.helpers import MODEL, S3Server, start_gateway, start_worker, wait_ready

pytestmark = pytest.mark.slow

BUCKET = "payloads"


@pytest.fixture
def small_nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A nats-server whose `max_payload` is 256 KiB: Shoal reads it and offloads above."""
    conf = tmp_path / "nats.conf"
    conf.write_text("max_payload: 262144\n")
    server = EmbeddedNats(tmp_path / "nats", extra_args=["-c", str(conf)])
    server.start(log_file=tmp_path / "nats-server.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path: Path) -> Iterator[tuple[dict[str, str], S3Server | None]]:
    if request.param == "local":
        yield {"SHOAL_OBJECTS__BACKEND": "local"}, None
        return
    s3 = S3Server(tmp_path / "s3").start()
    try:
        yield {"SHOAL_OBJECTS__BACKEND": "s3", "SHOAL_OBJECTS__BUCKET": BUCKET, **s3.env()}, s3
    finally:
        s3.stop()


def stored_payloads(tmp_path: Path, s3: S3Server | None) -> list[str]:
    if s3 is None:
        root = tmp_path / "objects" / "payloads"
        return [p.name for p in root.rglob("*") if p.is_file()] if root.exists() else []
    listing = s3.client().list_objects_v2(Bucket=BUCKET, Prefix="payloads/")
    return [o["Key"] for o in listing.get("Contents", [])]


def long_texts(count: int, size: int) -> list[str]:
    return [
        (f"passage {i} about rivers and the fish in them. " * size)[:size] for i in range(count)
    ]


def test_a_3_mib_request_is_offloaded_served_and_cleaned_up(
    small_nats, tmp_path: Path, store, st_model
) -> None:
    env, s3 = store
    # One text below is 3 MiB: past the default per-input bound (200k characters).
    env = {**env, "SHOAL_GATEWAY__MAX_INPUT_CHARS": str(4 << 20)}
    worker = start_worker(small_nats.url, tmp_path, extra=env)
    gateway, base = start_gateway(small_nats.url, tmp_path, env)
    try:
        wait_ready(base, worker)
        texts = long_texts(24, 128 << 10)  # 3 MiB, items of two texts: 256 KiB each
        oai = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=200)
        got = oai.embeddings.create(model=MODEL, input=texts)
        vectors = np.array([d.embedding for d in got.data])
        expected = st_model.encode(texts, batch_size=8)
        assert np.allclose(vectors, expected, atol=1e-4)
        # One text larger than any message (and than the default threshold, 1 MiB).
        huge = long_texts(1, 3 << 20)
        one = oai.embeddings.create(model=MODEL, input=huge)
        assert np.allclose(one.data[0].embedding, st_model.encode(huge)[0], atol=1e-4)
        # Replies over the limit too: each text's token vectors are 390 KB.
        reply = httpx.post(
            f"{base}/v1/multivector",
            json={"model": MODEL, "input": long_texts(4, 4000), "encoding_format": "base64"},
            timeout=120,
        )
        assert reply.status_code == 200, reply.text
        assert [d["tokens"] for d in reply.json()["data"]] == [254] * 4
        assert stored_payloads(tmp_path, s3) == []
    finally:
        gateway.stop()
        worker.stop()


def test_an_unreachable_store_is_a_503_at_once_and_small_requests_still_work(
    small_nats, tmp_path: Path
) -> None:
    s3 = S3Server(tmp_path / "s3").start()
    env = {"SHOAL_OBJECTS__BACKEND": "s3", "SHOAL_OBJECTS__BUCKET": BUCKET, **s3.env()}
    worker = start_worker(small_nats.url, tmp_path, extra=env)
    gateway, base = start_gateway(small_nats.url, tmp_path, env)
    try:
        wait_ready(base, worker)
        s3.stop()
        started = time.monotonic()
        response = httpx.post(
            f"{base}/v1/embeddings",
            json={"model": MODEL, "input": long_texts(4, 128 << 10)},
            timeout=120,
        )
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "payload_store_unavailable"
        assert response.headers["retry-after"]
        assert time.monotonic() - started < 60  # the store's timeouts, not the request's
        small = httpx.post(
            f"{base}/v1/embeddings", json={"model": MODEL, "input": "fits"}, timeout=60
        )
        assert small.status_code == 200
    finally:
        gateway.stop()
        worker.stop()
        s3.stop()
