"""A generation worker killed mid-stream: the job is redelivered, the next worker
regenerates it under the same seed, and the client's stream goes on without repeating a
word."""

from __future__ import annotations

import shutil

import httpx
import pytest

from tests.helpers import (
    GEN_MODEL,
    model_ready,
    start_gateway,
    start_worker,
    stream_chat_broken_midway,
    wait_until,
)

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

        def kill_and_replace() -> None:
            nonlocal second
            first.kill()  # mid-stream, no goodbye
            second = start_worker(
                nats_server.url,
                session_dir,
                models=GEN_MODEL,
                extra=fast,
                name="gen-second",
                kind="generate",
            )

        text, finish = stream_chat_broken_midway(base, body, 10, kill_and_replace)
        assert text == want
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
        try:
            line = " ".join(child.cmdline())
        except (psutil.ZombieProcess, psutil.NoSuchProcess):  # a killed one, not yet reaped
            continue
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
        killed = []

        def kill_the_pipeline() -> None:
            killed.append(_pipeline_process(worker.pid))
            killed[0].kill()

        text, _ = stream_chat_broken_midway(base, body, 10, kill_the_pipeline)
        assert text == want
        assert worker.alive() and _pipeline_process(worker.pid).pid != killed[0].pid
        log = worker.log_path.read_text(errors="replace")
        assert "the OpenVINO process of smollm2-135m-instruct restarted" in log
        # The stream was cut while generating, so the job was generated again.
        assert "generation failed: the OpenVINO process exited" in log
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
    # A cache of its own, without the session's OpenVINO IR, holding the converted
    # SmolLM2: no conversion here.
    target = tmp_path / "cache" / "gguf" / lm_dir.name
    shutil.copytree(lm_dir, target)
    env = {
        "SHOAL_GENERATOR__OPENVINO_EXPORT_COMMAND": "/nonexistent/optimum-cli",
        "SHOAL_CACHE_DIR": str(tmp_path / "cache"),
    }
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
