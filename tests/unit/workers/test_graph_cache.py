"""Converted OpenVINO graphs kept in the cache dir (`_graph_cache`): a second load of the
real MiniLM reads them instead of tracing again and answers the same; the key follows
what the trace depends on; a damaged entry is converted again."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import openvino as ov
import pytest
import torch
from transformers import BertConfig, BertModel

from perf.texts import load
from shoal.workers.adapters import _graph_cache, make_adapter
from shoal.workers.quality import embed
from tests.helpers import MINILM_SPEC

# Real models in process, seconds each: in `make test`, not `make check`.
pytestmark = pytest.mark.slow


def _entries(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "openvino-encoders").iterdir() if p.is_dir())


def test_a_second_load_reads_the_converted_graph_and_answers_the_same(
    minilm_path: str, tmp_path: Path, monkeypatch, caplog
) -> None:
    conversions = []
    real = ov.convert_model
    monkeypatch.setattr(ov, "convert_model", lambda *a, **k: conversions.append(1) or real(*a, **k))
    texts = load("short")[:24] + load("passages")[:4]
    caplog.set_level(logging.INFO)

    first = make_adapter(MINILM_SPEC, "cpu", cache_dir=tmp_path)
    first.load(minilm_path)
    converted = len(conversions)
    assert converted >= 1 and first.engine() == "openvino float32"
    assert len(_entries(tmp_path)) == converted
    assert all((entry / ".complete").exists() for entry in _entries(tmp_path))

    second = make_adapter(MINILM_SPEC, "cpu", cache_dir=tmp_path)
    second.load(minilm_path)
    assert len(conversions) == converted  # nothing traced again
    assert "OpenVINO graph read from" in caplog.text
    assert second.engine() == "openvino float32"
    np.testing.assert_array_equal(embed(second, texts), embed(first, texts))

    # Without a cache dir every load converts, as before.
    make_adapter(MINILM_SPEC, "cpu").load(minilm_path)
    assert len(conversions) == 2 * converted


def test_a_damaged_cached_graph_is_converted_again(
    minilm_path: str, tmp_path: Path, caplog
) -> None:
    first = make_adapter(MINILM_SPEC, "cpu", cache_dir=tmp_path)
    first.load(minilm_path)
    texts = load("short")[:8]
    expected = embed(first, texts)
    entries = _entries(tmp_path)
    for entry in entries:  # every byte of the weights changed
        weights = entry / "graph.bin"
        damaged = entry / "damaged.bin"
        (np.fromfile(weights, dtype=np.uint8) ^ np.uint8(1)).tofile(damaged)
        damaged.replace(weights)  # a new file: `first` maps the old one
    (entries[0] / "sha256").unlink()  # and a file gone
    caplog.set_level(logging.INFO)
    again = make_adapter(MINILM_SPEC, "cpu", cache_dir=tmp_path)
    again.load(minilm_path)
    assert "is damaged; converting it again" in caplog.text
    assert again.engine() == first.engine() == "openvino float32"
    assert again._engine_packs and first._engine_packs
    np.testing.assert_array_equal(embed(again, texts), expected)
    caplog.clear()
    make_adapter(MINILM_SPEC, "cpu", cache_dir=tmp_path).load(minilm_path)
    assert "OpenVINO graph read from" in caplog.text and "converting it again" not in caplog.text


def _tiny_bert(**config) -> BertModel:
    torch.manual_seed(0)
    small = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    return BertModel(BertConfig(vocab_size=64, intermediate_size=64, **(small | config))).eval()


def test_the_key_follows_the_weights_the_configuration_and_the_inputs() -> None:
    names = ["input_ids", "attention_mask"]
    key = _graph_cache.graph_key(_tiny_bert(), names)
    assert _graph_cache.graph_key(_tiny_bert(), names) == key  # the same model: the same key
    moved = _tiny_bert()
    moved.config._name_or_path = "/elsewhere/the-same-model"
    assert _graph_cache.graph_key(moved, names) == key  # wherever its files are

    nudged = _tiny_bert()
    with torch.no_grad():
        nudged.encoder.layer[0].output.dense.weight[3, 5] += 1e-6
    assert _graph_cache.graph_key(nudged, names) != key
    assert _graph_cache.graph_key(_tiny_bert(layer_norm_eps=1e-6), names) != key
    assert _graph_cache.graph_key(_tiny_bert(), [*names, "token_type_ids"]) != key
