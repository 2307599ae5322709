"""A generation worker killed mid-stream: the job is redelivered, the next worker
regenerates it under the same seed, and the client's stream goes on without repeating a
word."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from tests.helpers import GEN_MODEL, model_ready, start_gateway, start_worker, wait_until

pytestmark = pytest.mark.slow


def test_kill_9_mid_stream_then_the_stream_completes_without_duplication(
    nats_server, session_dir, stack
) -> None:
    fast = {"SHOAL_NATS__ACK_WAIT": "3"}
    first = start_worker(
        nats_server.url,
        session_dir,
        models=GEN_MODEL,
        extra=fast,
        name="gen-first",
        kind="generate",
    )
    gateway, base = start_gateway(
        nats_server.url, session_dir, {"SHOAL_GATEWAY__NO_WORKER_POLICY": "queue"}
    )
    second = None
    try:
        wait_until(lambda: model_ready(base, GEN_MODEL), 180, first, "first generation worker")
        body = {
            "model": GEN_MODEL,
            "max_tokens": 150,
            "temperature": 0.8,
            "seed": 7,
            "messages": [{"role": "user", "content": "Write a story about a fish."}],
        }
        whole = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120).json()
        want = whole["choices"][0]["message"]["content"]
        assert whole["usage"]["completion_tokens"] > 40, whole

        pieces: list[str] = []
        finish = None
        with httpx.stream(
            "POST", f"{base}/v1/chat/completions", json={**body, "stream": True}, timeout=180
        ) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                choice = chunk["choices"][0]
                pieces.append(choice["delta"].get("content") or "")
                finish = choice["finish_reason"] or finish
                if len(pieces) == 10 and second is None:
                    first.kill()  # mid-stream, no goodbye
                    second = start_worker(
                        nats_server.url,
                        session_dir,
                        models=GEN_MODEL,
                        extra=fast,
                        name="gen-second",
                        kind="generate",
                    )
        assert second is not None, "the stream ended before the worker could be killed"
        assert "".join(pieces) == want
        assert finish in ("stop", "length")
    finally:
        gateway.stop()
        first.stop()
        if second is not None:
            second.stop()


def _pipeline_process(worker_pid: int):
    """The OpenVINO pipeline's process: the worker's spawned child (not the resource
    tracker)."""
    import psutil

    for child in psutil.Process(worker_pid).children():
        line = " ".join(child.cmdline())
        if "multiprocessing.spawn" in line and "resource_tracker" not in line:
            return child
    raise AssertionError("the worker has no pipeline process")


def test_a_killed_pipeline_process_is_restarted_and_its_stream_completes(
    nats_server, session_dir, stack
) -> None:
    """SIGKILL the OpenVINO pipeline's process (what the OOM killer does) mid-stream: the
    worker starts a new one, the job is generated again under its seed, and the client's
    stream goes on without repeating a word; the model keeps serving."""
    worker = start_worker(nats_server.url, session_dir, GEN_MODEL, None, "gen-ov", "generate")
    gateway, base = start_gateway(nats_server.url, session_dir)
    try:
        wait_until(lambda: model_ready(base, GEN_MODEL), 180, worker, "the generation worker")
        body = {
            "model": GEN_MODEL,
            "max_tokens": 150,
            "temperature": 0.8,
            "seed": 11,
            "messages": [{"role": "user", "content": "Write a story about a lighthouse."}],
        }
        whole = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120).json()
        want = whole["choices"][0]["message"]["content"]
        assert whole["usage"]["completion_tokens"] > 40, whole
        killed = None
        pieces: list[str] = []
        with httpx.stream(
            "POST", f"{base}/v1/chat/completions", json={**body, "stream": True}, timeout=180
        ) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                pieces.append(chunk["choices"][0]["delta"].get("content") or "")
                if len(pieces) == 10 and killed is None:
                    killed = _pipeline_process(worker.pid)
                    killed.kill()
        assert killed is not None, "the stream ended before the pipeline could be killed"
        assert "".join(pieces) == want
        assert worker.alive() and _pipeline_process(worker.pid).pid != killed.pid
        assert "the OpenVINO process of smollm2-135m-instruct restarted" in worker.log()
        again = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120).json()
        assert again["choices"][0]["message"]["content"] == want
    finally:
        gateway.stop()
        worker.stop()


def test_without_its_export_tool_the_openvino_default_falls_back_to_transformers(
    nats_server, tmp_path, lm_dir
) -> None:
    """`engine = "auto"` (the default) serves the model anyway when OpenVINO cannot start
    here (no optimum-cli): with the transformers engine, said in the log and in
    /v1/models."""
    target = tmp_path / "cache" / "gguf" / lm_dir.name
    shutil.copytree(lm_dir, target)  # the converted SmolLM2: no conversion here
    env = {"SHOAL_GENERATOR__OPENVINO_EXPORT_COMMAND": "/nonexistent/optimum-cli"}
    worker = start_worker(nats_server.url, tmp_path, GEN_MODEL, env, "gen", "generate")
    gateway, base = start_gateway(nats_server.url, tmp_path)
    try:
        wait_until(lambda: model_ready(base, GEN_MODEL), 180, worker, "the generation worker")
        models = {m["id"]: m for m in httpx.get(f"{base}/v1/models").json()["data"]}
        assert models[GEN_MODEL]["engine"] == "torch float32"
        assert "the OpenVINO runtime failed" in worker.log()
        body = {
            "model": GEN_MODEL,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "Hi"}],
        }
        r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    finally:
        gateway.stop()
        worker.stop()
