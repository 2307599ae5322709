"""Packed rows: every input placed once, each with its own positions, the cheapest width
chosen; on the real MiniLM the packed engine, and torch on packed rows (without an
engine, and for LoRA batches), answer as sentence-transformers (and peft) do on any mix of
lengths, and a model whose outputs packing would change is served padded instead."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import msgspec
import numpy as np
import pytest

from perf.texts import load
from shoal.workers.adapters import _packing, make_adapter
from shoal.workers.adapters._packing import pack, packed_inputs
from shoal.workers.adapters.base import Tokenized
from shoal.workers.quality import embed
from tests.helpers import MINILM_SPEC
from tests.task_models import build_lora_adapter

# Real models in process, seconds each: in `make test`, not `make check`.
pytestmark = pytest.mark.slow

MINILM_ALPHA = 2 * 384 + 1536


def _rows(lengths: list[int]) -> list[Tokenized]:
    """Rows whose ids say which input and which token they are (input * 1000 + token)."""
    return [
        Tokenized(np.arange(n, dtype=np.int64) + 1000 * (i + 1), n) for i, n in enumerate(lengths)
    ]


@pytest.mark.parametrize(
    "lengths",
    [[5], [12, 30, 7, 19, 25, 11, 9, 28], [250, 3, 256, 40], [17] * 64, [64, 64, 1, 63]],
)
def test_every_input_lands_once_with_its_own_positions(lengths: list[int]) -> None:
    rows = _rows(lengths)
    packed = pack(rows, pad_id=0, alpha=MINILM_ALPHA)
    width = packed.ids.shape[1]
    assert width >= max(lengths)
    # Inputs in one row do not overlap and stay inside it.
    for r in range(packed.ids.shape[0]):
        mine = np.flatnonzero(packed.row == r)
        spans = sorted((packed.start[i], packed.start[i] + packed.length[i]) for i in mine)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
        assert all(s >= 0 and e <= width for s, e in spans)
    for i, n in enumerate(lengths):
        r, s = packed.row[i], packed.start[i]
        np.testing.assert_array_equal(packed.ids[r, s : s + n], rows[i].ids)
        np.testing.assert_array_equal(packed.positions[r, s : s + n], np.arange(n))
        assert (packed.segments[r, s : s + n] == i + 1).all()
    assert (packed.segments > 0).sum() == sum(lengths)  # the rest is padding, segment 0
    # The gather index brings each input's tokens back, in order, from the flat rows.
    inputs = packed_inputs(packed, types=False)
    flat = packed.ids.reshape(-1)
    for i, n in enumerate(lengths):
        np.testing.assert_array_equal(flat[inputs["gather"][i, :n]], rows[i].ids)
        assert inputs["mask"][i].sum() == n


def test_short_inputs_share_wider_rows_and_long_ones_keep_their_own() -> None:
    short = pack(_rows([12, 30, 7, 19, 25, 11, 9, 28] * 4), pad_id=0, alpha=MINILM_ALPHA)
    padded_tokens = 32 * 30
    assert short.ids.size < 0.8 * padded_tokens  # most of the padding is gone
    assert short.ids.shape[0] < 32  # rows hold several inputs
    long = pack(_rows([250, 240, 256, 230]), pad_id=0, alpha=MINILM_ALPHA)
    assert long.ids.shape == (4, 256)  # a wider row would cost more attention than it saves


def test_token_types_travel_with_their_tokens() -> None:
    rows = _rows([6, 9])
    rows[1].type_ids = np.array([0] * 4 + [1] * 5, dtype=np.int64)
    packed = pack(rows, pad_id=0, alpha=MINILM_ALPHA)
    inputs = packed_inputs(packed, types=True)
    r, s = packed.row[1], packed.start[1]
    np.testing.assert_array_equal(inputs["token_type_ids"][r, s : s + 9], rows[1].type_ids)


def _mixed_texts() -> list[str]:
    """Short queries beside passages at the length limit and empty text, shuffled."""
    texts = load("short")[:40] + load("passages")[:6] + ["", "a"]
    rng = np.random.default_rng(2)
    return [texts[i] for i in rng.permutation(len(texts))]


def test_the_shipped_minilm_runs_packed_and_answers_as_sentence_transformers(
    shared_cache: Path, minilm_path: str, st_model, caplog
) -> None:
    caplog.set_level(logging.INFO)
    adapter = make_adapter(MINILM_SPEC, "cpu", cache_dir=shared_cache)
    adapter.load(minilm_path)
    assert adapter._engine_packs
    assert "engine auto: openvino f32 on packed rows" in caplog.text
    texts = _mixed_texts()
    theirs = st_model.encode(texts, batch_size=len(texts), normalize_embeddings=True)
    ours = embed(adapter, texts, batch=len(texts))
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    # Alone, one at a time, the same vectors.
    np.testing.assert_allclose(embed(adapter, texts[:3], batch=1), theirs[:3], atol=1e-5)


def _count_packed_forwards(monkeypatch) -> list[int]:
    """Counts the packed forwards torch runs (a compiled engine runs its own copy)."""
    calls: list[int] = []
    real = _packing.PackedGraph.forward

    def counting(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(_packing.PackedGraph, "forward", counting)
    return calls


def test_torch_runs_packed_rows_where_no_engine_does(minilm_path: str, st_model, monkeypatch):
    calls = _count_packed_forwards(monkeypatch)
    spec = msgspec.structs.replace(
        MINILM_SPEC, profile=msgspec.structs.replace(MINILM_SPEC.profile, engine="torch")
    )
    adapter = make_adapter(spec, "cpu")
    adapter.load(minilm_path)
    assert adapter._engine is None and adapter._packed is not None
    texts = _mixed_texts()
    theirs = st_model.encode(texts, batch_size=len(texts), normalize_embeddings=True)
    calls.clear()  # the check at load ran it
    np.testing.assert_allclose(embed(adapter, texts, batch=len(texts)), theirs, atol=1e-5)
    assert calls == [1]  # one batch, packed, in torch


def test_lora_batches_run_packed_in_torch_as_peft_computes_them(
    shared_cache: Path, minilm_path: str, tmp_path, monkeypatch
) -> None:
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer

    lora = build_lora_adapter(tmp_path / "lora", seed=5)
    # The base runs in the engine.
    adapter = make_adapter(MINILM_SPEC, "cpu", cache_dir=shared_cache)
    adapter.load(minilm_path)
    adapter.lora.ensure("mine", str(lora))
    texts = _mixed_texts()
    calls = _count_packed_forwards(monkeypatch)
    with adapter.lora.active("mine"):
        tuned = embed(adapter, texts, batch=len(texts))
    assert calls == [1]
    reference = SentenceTransformer(minilm_path, device="cpu")
    reference[0].model = PeftModel.from_pretrained(reference[0].model, str(lora))
    theirs = reference.encode(texts, batch_size=len(texts), normalize_embeddings=True)
    np.testing.assert_allclose(tuned, theirs, atol=1e-5)
    # The base model's batches still run in the engine, untouched by the adapter.
    base = embed(adapter, texts[:8])
    assert calls == [1] and np.abs(base - tuned[:8]).max() > 1e-3


def test_a_model_that_packing_would_change_is_served_padded(
    minilm_path: str, st_model, monkeypatch, caplog
) -> None:
    # A model that ignores the block-diagonal mask (tokens see the other inputs of their
    # row) is simulated: every packed model here honours it.
    real = _packing.PackedGraph.forward

    def leaking(self, input_ids, segments, position_ids, gather, mask, token_type_ids=None):
        return real(self, input_ids, segments.clamp(max=1), position_ids, gather, mask)

    monkeypatch.setattr(_packing.PackedGraph, "forward", leaking)
    caplog.set_level(logging.INFO)
    # No shared cache: a graph traced through the leaking forward must not be kept for others.
    adapter = make_adapter(MINILM_SPEC, "cpu")
    adapter.load(minilm_path)
    assert adapter._packed is None and adapter.engine() == "openvino float32"
    assert "packed rows off" in caplog.text
    assert "engine auto: openvino (openvino f32 kept" in caplog.text
    texts = load("short")[:16]
    theirs = st_model.encode(texts, batch_size=16, normalize_embeddings=True)
    np.testing.assert_allclose(embed(adapter, texts, batch=16), theirs, atol=1e-5)


def test_a_roberta_family_encoder_packs_with_its_own_position_numbering(
    shared_cache: Path, minilm_path: str, tmp_path
) -> None:
    # A tiny random RoBERTa (no XLM-R checkpoint loads offline here): its positions start
    # at padding_idx + 1, which packing must follow for the check at load to pass.
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    config = RobertaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=130,
        pad_token_id=tokenizer.pad_token_id,
        type_vocab_size=1,
    )
    torch.manual_seed(0)
    RobertaModel(config).save_pretrained(tmp_path / "hf")
    tokenizer.save_pretrained(tmp_path / "hf")
    transformer = models.Transformer(str(tmp_path / "hf"), max_seq_length=128)
    st = SentenceTransformer(modules=[transformer, models.Pooling(64, "mean"), models.Normalize()])
    st.save(str(tmp_path / "st"))
    spec = msgspec.structs.replace(
        MINILM_SPEC, id="tiny-roberta", source=str(tmp_path / "st"), dims=64, max_length=128
    )
    adapter = make_adapter(spec, "cpu", cache_dir=shared_cache)
    adapter.load(str(tmp_path / "st"))
    assert adapter._packed is not None and adapter._packed.first_position == 1
    texts = load("short")[:24] + load("passages")[:2]
    theirs = st.encode(texts, batch_size=len(texts), normalize_embeddings=True)
    np.testing.assert_allclose(embed(adapter, texts, batch=len(texts)), theirs, atol=1e-5)


def test_token_vectors_run_packed_in_torch_as_sentence_transformers_gives_them(
    shared_cache: Path, minilm_path: str, st_model, monkeypatch
) -> None:
    from shoal.queue.messages import MultiVectorJob

    spec = msgspec.structs.replace(MINILM_SPEC, tasks=["embed", "multivector"])
    adapter = make_adapter(spec, "cpu", cache_dir=shared_cache)
    adapter.load(minilm_path)
    assert adapter._packed_tokens is not None
    texts = _mixed_texts()
    job = MultiVectorJob(
        request_id="r", part=0, model=spec.id, reply_to="", deadline=0, texts=texts
    )
    calls = _count_packed_forwards(monkeypatch)
    ours = adapter.forward("multivector", adapter.units(job))
    assert calls == [1]  # one batch, packed, in torch
    theirs = st_model.encode(texts, output_value="token_embeddings", batch_size=1)
    assert len(ours) == len(theirs)
    for mine, alone in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(mine, alone.numpy(), atol=1e-5)
