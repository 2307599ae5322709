"""The OpenVINO engine on the real MiniLM and MiniLM task heads (rerank, NER): the same answers as
torch within the quality floor, LoRA adapters in torch (packed, as peft computes them,
a head's own classifier copy included), a compiled copy per thread
count, and a clear error where the package is missing. The shipped `auto` engine picks it
on a CPU only when its outputs keep the exact floor against float32 torch."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch

from perf.texts import load
from shoal.model_registry import ModelRegistry, ModelSpec
from shoal.queue.messages import NerJob, RerankJob, SparseJob
from shoal.workers.adapters import _openvino, make_adapter
from shoal.workers.adapters.cpu import cpu_has_native_bf16
from shoal.workers.quality import QUALITY_FLOOR, cosine_vs_float32, embed
from tests.helpers import MINILM_SPEC
from tests.task_models import build_lora_adapter, build_task_models

# Real models in process, seconds each: in `make test`, not `make check`.
pytestmark = pytest.mark.slow

SPEC = MINILM_SPEC


def _on(spec: ModelSpec, engine: str, dtype: str = "float32") -> ModelSpec:
    profile = msgspec.structs.replace(spec.profile, engine=engine, dtype=dtype)
    return msgspec.structs.replace(spec, profile=profile)


def test_auto_serves_openvino_float32_on_a_cpu_and_says_why(
    shared_cache: Path, minilm_path: str, st_model, caplog
) -> None:
    assert SPEC.profile.engine == "auto" and SPEC.profile.dtype == "float32"  # as shipped
    caplog.set_level(logging.INFO)
    adapter = make_adapter(SPEC, "cpu", cache_dir=shared_cache)
    adapter.load(minilm_path)
    assert adapter.engine() == "openvino float32"
    assert f"model {SPEC.id}: engine auto: openvino" in caplog.text
    texts = load("short")[:40] + load("passages")[:8]
    theirs = st_model.encode(texts, batch_size=16, normalize_embeddings=True)
    np.testing.assert_allclose(embed(adapter, texts, batch=16), theirs, atol=1e-5)


def test_auto_keeps_torch_when_the_engine_drifts(
    shared_cache: Path, minilm_path: str, monkeypatch, caplog
) -> None:
    # No engine installed here drifts from float32; one that does is simulated by adding
    # noise to the real compiled graph's outputs.
    real = _openvino.OpenVinoGraph.__call__
    noise = np.random.default_rng(0)

    def drifting(self, inputs, threads):
        out = real(self, inputs, threads)
        return out + 0.01 * noise.standard_normal(out.shape).astype(np.float32)

    monkeypatch.setattr(_openvino.OpenVinoGraph, "__call__", drifting)
    caplog.set_level(logging.INFO)
    adapter = make_adapter(SPEC, "cpu", cache_dir=shared_cache)
    adapter.load(minilm_path)
    assert adapter._engine is None and adapter.engine() == "torch float32"
    assert f"model {SPEC.id}: engine auto: torch (openvino f32 kept a worst cosine" in caplog.text


def test_auto_serves_torch_where_openvino_is_missing(minilm_path: str, monkeypatch, caplog):
    # openvino is installed here; its absence (a slim image) is simulated.
    monkeypatch.setattr(_openvino, "available", lambda: False)
    caplog.set_level(logging.INFO)
    adapter = make_adapter(SPEC, "cpu")
    adapter.load(minilm_path)
    assert adapter.engine() == "torch float32"
    assert "engine auto: torch (openvino is not installed)" in caplog.text


def test_engine_torch_forces_torch(minilm_path: str) -> None:
    adapter = make_adapter(_on(SPEC, "torch"), "cpu")
    adapter.load(minilm_path)
    assert adapter._engine is None and adapter.engine() == "torch float32"


def test_float32_openvino_matches_sentence_transformers(
    shared_cache: Path, minilm_path: str, st_model
) -> None:
    texts = load("short")[:40] + load("passages")[:8]
    adapter = make_adapter(_on(SPEC, "openvino"), "cpu", cache_dir=shared_cache)
    adapter.load(minilm_path)
    assert adapter._engine is not None and adapter._engine.precision == "f32"
    ours = embed(adapter, texts, batch=16)
    theirs = st_model.encode(texts, batch_size=16, normalize_embeddings=True)
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_bf16_openvino_keeps_cosine_over_the_floor_on_the_perf_texts(
    shared_cache: Path, minilm_path: str, caplog
) -> None:
    texts = load("short")[:96] + load("passages")[:24]
    caplog.set_level(logging.WARNING)
    worst, mean = cosine_vs_float32(
        _on(SPEC, "openvino", "bfloat16"), minilm_path, texts, cache_dir=shared_cache
    )
    assert worst >= QUALITY_FLOOR
    if cpu_has_native_bf16():
        assert worst < 1 - 1e-7  # bf16 really ran: the vectors moved, a little
        assert mean > 0.9999
    else:  # OpenVINO is told float32 where bf16 would be emulated
        assert worst > 1 - 1e-5
        assert "serving float32" in caplog.text


def test_a_compiled_copy_per_thread_count_with_the_same_answers(
    shared_cache: Path, minilm_path: str
) -> None:
    adapter = make_adapter(_on(SPEC, "openvino"), "cpu", cache_dir=shared_cache)
    adapter.load(minilm_path)
    texts = load("short")[:16]
    before = torch.get_num_threads()
    try:
        outputs = []
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            outputs.append(embed(adapter, texts))
    finally:
        torch.set_num_threads(before)
    assert adapter._engine.compiled == 2
    np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-5)
    np.testing.assert_allclose(outputs[0], outputs[2], atol=0)
    # The compiled copies count in the model's memory (residency decisions use it).
    torch_only = make_adapter(_on(SPEC, "torch"), "cpu")
    torch_only.load(minilm_path)
    assert adapter.memory_bytes() >= 3 * torch_only.memory_bytes()


def test_two_passes_side_by_side_give_the_answers_of_one_alone(
    shared_cache: Path, minilm_path: str, st_model
):
    adapter = make_adapter(SPEC, "cpu", cache_dir=shared_cache)
    adapter.load(minilm_path)
    assert adapter.runs_side_by_side("embed", "")
    assert not adapter.runs_side_by_side("embed", "my-lora")  # LoRA runs in torch
    assert not adapter.runs_side_by_side("multivector", "")  # token vectors too
    texts = [load("short")[:48], load("passages")[:12]]
    alone = [embed(adapter, part, batch=12) for part in texts]
    results: dict[int, np.ndarray] = {}

    def beside(i: int) -> None:
        with _openvino.side_by_side(2):
            results[i] = embed(adapter, texts[i], batch=12)

    threads = [threading.Thread(target=beside, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in (0, 1):
        np.testing.assert_allclose(results[i], alone[i], atol=1e-5)
        theirs = st_model.encode(texts[i], batch_size=12, normalize_embeddings=True)
        np.testing.assert_allclose(results[i], theirs, atol=1e-5)
    # One more compiled copy (two streams sharing the threads), counted in memory.
    assert adapter._engine.compiled == 2


def test_lora_requests_run_in_torch_and_the_base_in_openvino(
    shared_cache: Path, minilm_path: str, tmp_path: Path
) -> None:
    lora = build_lora_adapter(tmp_path / "lora", seed=4)
    texts = load("short")[:8]
    exact = make_adapter(_on(SPEC, "torch"), "cpu")
    exact.load(minilm_path)
    adapter = make_adapter(_on(SPEC, "openvino"), "cpu", cache_dir=shared_cache)
    adapter.load(minilm_path)
    adapter.lora.ensure("mine", str(lora))
    exact.lora.ensure("mine", str(lora))

    def run(a, name: str) -> np.ndarray:
        with a.lora.active(name):
            return embed(a, texts)

    calls: list[int] = []
    adapter._engine = _Counting(adapter._engine, calls)
    base, tuned = run(adapter, ""), run(adapter, "mine")
    assert len(calls) == 1  # the base batch only
    np.testing.assert_allclose(base, run(exact, ""), atol=1e-4)
    np.testing.assert_allclose(tuned, run(exact, "mine"), atol=1e-5)
    assert np.abs(base - tuned).max() > 1e-3  # the adapter changed the output


class _Counting:
    """Wraps the real engine to count the batches it ran (the engine still runs them)."""

    def __init__(self, engine: _openvino.OpenVinoGraph, calls: list) -> None:
        self.engine, self.calls = engine, calls
        self.precision, self.compiled = engine.precision, engine.compiled

    def __call__(self, inputs, threads):
        self.calls.append(threads)
        return self.engine(inputs, threads)


@pytest.fixture(scope="module")
def task_specs(tmp_path_factory: pytest.TempPathFactory) -> ModelRegistry:
    return ModelRegistry.from_files(build_task_models(tmp_path_factory.mktemp("tasks")))


@pytest.mark.parametrize(
    ("model", "op"), [("test-reranker", "rerank"), ("test-ner", "ner"), ("test-splade", "sparse")]
)
def test_task_heads_answer_the_same_in_openvino_picked_by_auto(
    shared_cache: Path, task_specs, model: str, op: str
) -> None:
    spec = task_specs.resolve(model)
    adapters = []
    for engine in ("torch", "auto", "torch"):
        adapter = make_adapter(_on(spec, engine), "cpu", cache_dir=shared_cache)
        adapter.load(spec.source)
        adapters.append(adapter)
    # The shipped `auto` picks OpenVINO for the heads too (a reranker's one score per row
    # is guarded as a column).
    assert adapters[1].engine() == "openvino float32"
    # Both run packed rows (the checks at load held), compared with the model's own
    # forward on padded batches.
    assert adapters[1]._engine_packs and adapters[0]._packed is not None
    adapters[2]._packed = None
    common = {"request_id": "r", "part": 0, "model": spec.id, "reply_to": "", "deadline": 0}
    texts = load("short")[:12] + load("passages")[:2]  # NER windows the passages
    job = (
        RerankJob(**common, query="where do salmon spawn", documents=texts)
        if op == "rerank"
        else NerJob(**common, texts=texts)
        if op == "ner"
        else SparseJob(**common, texts=texts)
    )
    torch_out, openvino_out, padded = (a.forward(op, a.units(job)) for a in adapters)
    assert len(torch_out) == len(openvino_out) == len(padded) == len(adapters[0].units(job))
    for torch_packed, ours, theirs in zip(torch_out, openvino_out, padded, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-4)
        np.testing.assert_allclose(torch_packed, theirs, atol=1e-5)


def test_a_missing_openvino_package_fails_the_load_clearly(minilm_path: str, monkeypatch) -> None:
    # openvino is installed here; its absence (a gateway-only image) is simulated.
    monkeypatch.setattr(_openvino, "available", lambda: False)
    adapter = make_adapter(_on(SPEC, "openvino"), "cpu")
    with pytest.raises(RuntimeError, match="needs the openvino package"):
        adapter.load(minilm_path)


def test_a_head_lora_with_its_own_classifier_runs_packed_as_peft_computes_it(
    shared_cache: Path, task_specs, tmp_path: Path, monkeypatch
) -> None:
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from shoal.queue.messages import ClassifyJob
    from shoal.workers.adapters import _packing

    spec = task_specs.resolve("test-classifier")
    # A sequence-classification LoRA keeps its own trained copy of the classifier
    # (peft's `modules_to_save`), which peft swaps in on the model itself.
    torch.manual_seed(7)
    config = LoraConfig(
        task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query", "value"],
        init_lora_weights=False,
    )  # fmt: skip
    tuned = get_peft_model(AutoModelForSequenceClassification.from_pretrained(spec.source), config)
    with torch.no_grad():
        for name, weight in tuned.named_parameters():
            if "modules_to_save" in name:
                weight.add_(torch.randn_like(weight))
    tuned.save_pretrained(tmp_path / "lora")
    # The base runs in the engine, LoRA in torch.
    adapter = make_adapter(spec, "cpu", cache_dir=shared_cache)
    adapter.load(spec.source)
    adapter.lora.ensure("mine", str(tmp_path / "lora"))
    texts = load("short")[:12] + load("passages")[:2]
    job = ClassifyJob(request_id="r", part=0, model=spec.id, reply_to="", deadline=0, texts=texts)
    calls: list[int] = []
    real = _packing.PackedGraph.forward
    monkeypatch.setattr(
        _packing.PackedGraph,
        "forward",
        lambda self, *a, **k: calls.append(1) or real(self, *a, **k),
    )
    with adapter.lora.active("mine"):
        ours = np.asarray(adapter.forward("classify", adapter.units(job)))
    base = np.asarray(adapter.forward("classify", adapter.units(job)))
    assert calls == [1]  # the LoRA batch ran packed, in torch; the base one in the engine
    reference = PeftModel.from_pretrained(
        AutoModelForSequenceClassification.from_pretrained(spec.source), str(tmp_path / "lora")
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(spec.source)

    def tokenize(texts: list[str], **kwargs):
        return tokenizer(texts, truncation=True, max_length=adapter.max_length, **kwargs)

    with torch.inference_mode():
        theirs = np.concatenate(
            [reference(**tokenize([t], return_tensors="pt")).logits.numpy() for t in texts]
        )
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert np.abs(ours - base).max() > 1e-2  # the adapter (and its classifier) changed them
