"""`weights = "int8"` on the OpenVINO runtime: served compressed only when the load-time
check finds it agrees with full precision often enough, else full precision, said."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers import GEN_MODEL, model_ready, start_gateway, start_worker, wait_until

pytestmark = pytest.mark.slow


def _spec(path: Path, lm_dir: Path) -> Path:
    path.write_text(
        f'[[models]]\nid = "{GEN_MODEL}"\ntasks = ["generate"]\nruntime = "transformers"\n'
        f'source = "{lm_dir}"\nmax_length = 2048\n'
        '[models.profile]\nmax_batch_items = 8\nweights = "int8"\n'
    )
    return path


def _serve(nats_url: str, data_dir: Path, env: dict[str, str]) -> tuple[str, str]:
    """Start a generation worker and a gateway, wait for the model; the engine it shows
    and the worker's log."""
    worker = start_worker(nats_url, data_dir, GEN_MODEL, env, "gen", "generate")
    gateway, base = start_gateway(nats_url, data_dir, env)
    try:
        wait_until(lambda: model_ready(base, GEN_MODEL), 240, worker, "the generation worker")
        models = {m["id"]: m for m in httpx.get(f"{base}/v1/models", timeout=10).json()["data"]}
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=60)
        r = client.chat.completions.create(
            model=GEN_MODEL,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=12,
            temperature=0,
        )
        assert r.choices[0].message.content and r.usage.completion_tokens > 0
        return models[GEN_MODEL]["engine"], worker.log_path.read_text(errors="replace")
    finally:
        gateway.stop()
        worker.stop()


def test_int8_weights_serve_only_above_the_agreement_floor(
    nats_server, tmp_path, shared_cache, lm_dir
) -> None:
    # A cache of its own, so the agreement this test reads is this worker's; the session
    # stack's IR (keyed by lm_dir's path) is linked in, so the float32 export is not
    # run again.
    cache = tmp_path / "cache"
    shutil.copytree(shared_cache / "openvino", cache / "openvino", copy_function=os.link)
    env = {
        "SHOAL_MODELS_FILE": str(_spec(tmp_path / "models.toml", lm_dir)),
        "SHOAL_CACHE_DIR": str(cache),
    }

    engine, _ = _serve(nats_server.url, tmp_path, env)
    assert engine.startswith("openvino float32, int8 weights (top-1 agreement 0.9"), engine
    [stored] = list((tmp_path / "cache" / "openvino").glob("*/agreement.json"))
    measured = json.loads(stored.read_text())["agreement"]
    # Not exact (else the check measures nothing), and close: SmolLM2 keeps ~0.95.
    assert 0.9 <= measured["top1"] < 1.0 and 0 < measured["kl"] < 0.05, measured
    assert measured["positions"] > 100

    # A floor the compressed weights cannot reach: the model serves at full precision.
    strict = env | {"SHOAL_GENERATOR__MIN_WEIGHT_AGREEMENT": "1.0"}
    engine, log = _serve(nats_server.url, tmp_path, strict)
    # The int8 copy still drafts for a lone greedy stream: the float32 model checks it.
    assert engine == "openvino float32, int8 draft when alone"
    assert "int8 weights not served" in log and "below 1.000" in log
