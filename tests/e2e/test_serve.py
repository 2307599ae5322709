"""`shoal serve`: one command brings the whole system up; Ctrl-C takes all of it down."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import openai
import psutil
import pytest

from shoal.queue.embedded import free_port
from tests.helpers import cache_env, start_serve, stop_with_ctrl_c, wait_ready, wait_until

pytestmark = pytest.mark.slow

SECRET = "s3-secret-that-must-stay-private"


def test_serve_answers_the_openai_sdk_and_stops_cleanly_on_ctrl_c(tmp_path, model_name) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env["SHOAL_DATA_DIR"] = str(tmp_path / "data")
    env.update(cache_env())
    env["SHOAL_S3__SECRET_ACCESS_KEY"] = SECRET  # what the children's settings carry
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115
    serve = subprocess.Popen(
        [sys.executable, "-m", "shoal", "serve", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}", timeout=180)
        children = psutil.Process(serve.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        assert "nats-server" in names and "worker" in names and "gateway" in names
        assert (tmp_path / "data" / "nats").is_dir()  # JetStream data in the data dir
        # The children's settings hold secrets: this user's alone, in a private data dir.
        settings = tmp_path / "data" / "run" / "settings.json"
        assert SECRET.encode() in settings.read_bytes()
        assert stat.S_IMODE(settings.stat().st_mode) == 0o600
        for private in (tmp_path / "data", tmp_path / "data" / "run"):
            assert stat.S_IMODE(private.stat().st_mode) == 0o700

        # The log says when it is ready, and for which models, as each comes (the
        # generation model may come first); it asks /ready once a second.
        line = f"shoal: ready on http://127.0.0.1:{port}: "

        def ready_lines() -> list[str]:
            text = (tmp_path / "serve.log").read_text(errors="replace")
            return [row for row in text.splitlines() if line in row]

        wait_until(lambda: any(model_name in r for r in ready_lines()), 60, None, "ready line")
        assert len(ready_lines()) <= 2  # one line per model that came, none repeated

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        response = client.embeddings.create(model=model_name, input=["hello", "world"])
        assert len(response.data) == 2 and len(response.data[0].embedding) == 384

        assert stop_with_ctrl_c(serve, children, timeout=60) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
        log.close()
    logged = (tmp_path / "serve.log").read_bytes()
    assert b"stopped" in logged and SECRET.encode() not in logged


DEMO_REQUESTS = {  # each demo model through its route, and a field its answer has
    "demo-ner": ("/v1/ner", {"input": ["Ada Lovelace lived in London."]}, "entities"),
    "demo-reranker": ("/v1/rerank", {"query": "q", "documents": ["a", "b"]}, "relevance_score"),
    "demo-classifier": ("/v1/classify", {"input": ["What a lovely day."]}, "labels"),
    "demo-splade": ("/v1/sparse", {"input": ["hybrid search"], "top_k": 8}, "indices"),
    "demo-colbert": ("/v1/multivector", {"input": ["hello world"]}, "embeddings"),
}


def test_serve_demo_serves_every_demo_model_through_its_route(tmp_path) -> None:
    import httpx

    from shoal.demo import ensure_demo_models

    data = tmp_path / "data"
    serve, base = start_serve(data, "--demo", extra={"SHOAL_SERVE_GENERATION": "false"})
    try:
        wait_ready(base, serve, timeout=180)
        with httpx.Client(base_url=base, timeout=120) as http:
            listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
            for model, (route, body, field) in DEMO_REQUESTS.items():
                assert listed[model]["owned_by"] == "shoal-demo"
                r = http.post(route, json={"model": model, **body})
                assert r.status_code == 200, r.text
                answer = r.json()
                assert field in (answer["results"] if "results" in answer else answer["data"])[0]
            # score is the reranker's other route
            r = http.post(
                "/v1/score", json={"model": "demo-reranker", "text_1": "q", "text_2": ["a"]}
            )
            assert r.status_code == 200 and r.json()["data"][0]["score"] is not None
        started = time.monotonic()
        assert serve.stop(signal.SIGTERM, timeout=15) == 0
        assert time.monotonic() - started < 10
    finally:
        serve.kill()
    # Built once, then reused: a later start finds them whole and builds nothing.
    spec = data / "demo-models" / "models.toml"
    built = spec.stat().st_mtime_ns
    started = time.monotonic()
    assert ensure_demo_models(data) == spec
    assert time.monotonic() - started < 1 and spec.stat().st_mtime_ns == built


def test_a_stop_while_the_demo_models_build_exits_at_once(tmp_path) -> None:
    data = tmp_path / "data"
    serve, _ = start_serve(data, "--demo", extra={"SHOAL_SERVE_GENERATION": "false"})
    try:
        wait_until(lambda: "building the demo models" in serve.log(), 60, serve, "the build")
        time.sleep(1.0)  # the build's child is importing torch
        started = time.monotonic()
        assert serve.stop(signal.SIGTERM, timeout=15) == 0
        assert time.monotonic() - started < 5
    finally:
        serve.kill()
    assert not list(data.glob("demo-models*")), "a half-built directory was left behind"
    assert "stopped while starting" in serve.log_path.read_text()
