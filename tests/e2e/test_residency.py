"""A worker whose memory budget fits two of three models serves all three, evicting the
least recently used; its pinned model is never evicted; a model too large for the budget
gets a clear error."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.test_errors import check_error
from tests.helpers import MODEL, rounded, start_gateway, start_worker, wait_ready, wait_until

pytestmark = pytest.mark.slow

MIB = 2**20
# Each fixture model is MiniLM-sized: about 87 MiB of float32 weights, and as much again
# for the compiled copy the default engine (OpenVINO, on this CPU) keeps beside them. The
# pinned MiniLM plus one task model fit, a third does not.
BUDGET = 420 * MIB

CALLS = {
    "test-reranker": ("/v1/rerank", {"query": "where", "documents": ["here", "there", "x"]}),
    "test-classifier": ("/v1/classify", {"input": ["good", "bad"]}),
    MODEL: ("/v1/embeddings", {"input": ["pinned"], "encoding_format": "float"}),
}


def _status(base: str) -> dict:
    [worker] = httpx.get(f"{base}/admin/v1/status").json()["workers"]
    return worker


def test_round_robin_over_three_models_with_room_for_two(nats_server, tmp_path, task_models):
    env = {"SHOAL_MODELS_FILE": str(task_models), "SHOAL_WORKER__MEMORY_BUDGET": str(BUDGET)}
    worker = start_worker(nats_server.url, tmp_path, models=",".join(CALLS), extra=env)
    gateway, base = start_gateway(nats_server.url, tmp_path, env)
    try:
        wait_ready(base, worker)
        http = httpx.Client(base_url=base, timeout=120)

        def call(model: str) -> dict:
            path, body = CALLS[model]
            r = http.post(path, json={"model": model, **body})
            assert r.status_code == 200, r.text
            out = r.json()
            out.pop("usage")
            return out

        first = {model: call(model) for model in CALLS}
        for _ in range(3):
            for model in CALLS:
                assert rounded(call(model)) == rounded(first[model])
                status = _status(base)
                assert MODEL in status["resident"]  # pinned: never evicted
                assert status["resident_bytes"] <= BUDGET
        wait_until(lambda: _status(base)["evictions"] >= 5, 10, worker, "heartbeat")
        status = _status(base)
        assert status["loads"] >= 7 and status["memory_budget"] == BUDGET
        ready = {m["id"]: m["ready"] for m in http.get("/v1/models").json()["data"]}
        assert ready[MODEL] and not (ready["test-reranker"] and ready["test-classifier"])
    finally:
        gateway.stop()
        worker.stop()


def test_a_model_that_cannot_fit_alone_is_a_clear_error(nats_server, tmp_path, task_models):
    env = {
        "SHOAL_MODELS_FILE": str(task_models),
        "SHOAL_WORKER__MEMORY_BUDGET": str(20 * MIB),
        "SHOAL_WORKER__PINNED": "none",
    }
    worker = start_worker(nats_server.url, tmp_path, models="test-classifier", extra=env)
    gateway, base = start_gateway(nats_server.url, tmp_path, env)
    try:
        wait_until(lambda: _has_worker(base), 60, worker, "worker heartbeat")
        r = httpx.post(
            f"{base}/v1/classify", json={"model": "test-classifier", "input": "x"}, timeout=60
        )
        error = check_error(r, 503)
        assert "needs about" in error["message"] and "MiB" in error["message"]
        assert worker.alive()
    finally:
        gateway.stop()
        worker.stop()


def _has_worker(base: str) -> bool:
    return bool(httpx.get(f"{base}/admin/v1/status").json()["workers"])
