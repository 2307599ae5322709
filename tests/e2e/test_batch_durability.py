"""Kill the batch runner (its gateway) or a worker with SIGKILL mid-batch, start another:
the batch completes with every custom_id exactly once; the same with files on S3.

Sized by what it proves, not by volume: the batch is throttled (a few lines in flight,
one line per request) so that it is certainly still running when the kill comes, on a
fast machine as on a loaded one; the test checks that it was."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from tests.e2e.test_batches import client, embed_lines, jsonl, output_lines, wait_batch
from tests.helpers import S3Server, start_gateway, start_worker, wait_ready

pytestmark = pytest.mark.slow

LINES = 1500
KILL_AFTER = 150
"""Lines completed (and saved) before the kill: the restart must skip these."""
FAST = {
    # Short leases and redelivery, so a takeover happens within seconds in the test.
    "SHOAL_BATCHES__LEASE_SECONDS": "3",
    "SHOAL_NATS__ACK_WAIT": "3",
    "SHOAL_GATEWAY__NO_WORKER_POLICY": "queue",
}
THROTTLED = {
    **FAST,
    # 8 lines in flight, each its own request: still running when the kill comes.
    "SHOAL_BATCHES__MAX_IN_FLIGHT": "8",
    "SHOAL_BATCHES__PACK_INPUTS": "1",
}


@pytest.fixture(params=["local", "s3"])
def backend(request, tmp_path: Path) -> Iterator[dict[str, str]]:
    if request.param == "local":
        yield {"SHOAL_OBJECTS__BACKEND": "local"}
        return
    s3 = S3Server(tmp_path / "s3").start()
    try:
        yield {"SHOAL_OBJECTS__BACKEND": "s3", "SHOAL_OBJECTS__BUCKET": "batches", **s3.env()}
    finally:
        s3.stop()


def start_batch(oai: OpenAI) -> str:
    lines = embed_lines(LINES, prefix="d")
    uploaded = oai.files.create(file=("big.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = oai.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    return batch.id


def wait_mid_batch(oai: OpenAI, batch_id: str) -> None:
    """Until KILL_AFTER lines are done, checking the batch is still running then."""
    batch = wait_batch(
        oai,
        batch_id,
        timeout=120,
        until=lambda b: (b.request_counts.completed or 0) >= KILL_AFTER,
        what=f"{KILL_AFTER} completed lines",
    )
    assert batch.status == "in_progress" and batch.request_counts.completed < LINES, (
        f"the batch was no longer running when the kill came: {batch}"
    )


def assert_exactly_once(oai: OpenAI, batch_id: str) -> None:
    done = wait_batch(oai, batch_id, timeout=200)
    assert done.status == "completed", done
    assert done.request_counts.completed == LINES
    assert done.request_counts.failed == 0
    ids = [line["custom_id"] for line in output_lines(oai, done.output_file_id)]
    assert len(ids) == LINES
    assert set(ids) == {f"d-{i}" for i in range(LINES)}


def test_runner_killed_mid_batch_another_finishes_it_exactly_once(
    nats_server, tmp_path: Path, backend: dict[str, str]
) -> None:
    env = {**FAST, **backend}
    worker = start_worker(nats_server.url, tmp_path, extra=env)
    first, base = start_gateway(nats_server.url, tmp_path, {**env, **THROTTLED})
    second = None
    try:
        wait_ready(base, worker)
        oai = client(base)
        batch_id = start_batch(oai)
        wait_mid_batch(oai, batch_id)
        first.kill()
        # At full speed, logging at info: its resume line is asserted.
        second, base = start_gateway(nats_server.url, tmp_path, {**env, "SHOAL_LOG_LEVEL": "info"})
        assert_exactly_once(client(base), batch_id)
        assert "resuming with" in second.log()
    finally:
        for proc in (second, first, worker):
            if proc is not None:
                proc.stop()


def test_worker_killed_mid_batch_the_batch_still_completes_exactly_once(
    nats_server, tmp_path: Path
) -> None:
    worker = start_worker(nats_server.url, tmp_path, extra=FAST, name="first-worker")
    gateway, base = start_gateway(nats_server.url, tmp_path, THROTTLED)
    replacement = None
    try:
        wait_ready(base, worker)
        oai = client(base)
        batch_id = start_batch(oai)
        wait_mid_batch(oai, batch_id)
        worker.kill()
        replacement = start_worker(nats_server.url, tmp_path, extra=FAST, name="second-worker")
        assert_exactly_once(oai, batch_id)
    finally:
        for proc in (replacement, gateway, worker):
            if proc is not None:
                proc.stop()
