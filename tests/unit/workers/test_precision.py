"""The bf16 profile on the real MiniLM in torch: faster precision only where the quality
holds (the OpenVINO engine's precisions are in test_openvino_engine)."""

from __future__ import annotations

import logging

import msgspec
import numpy as np
import pytest

from perf.texts import load
from shoal.model_registry import ModelSpec
from shoal.workers.adapters import make_adapter
from shoal.workers.adapters.cpu import cpu_has_native_bf16
from shoal.workers.quality import QUALITY_FLOOR, cosine_vs_float32, embed
from tests.helpers import MINILM_SPEC

# Real models in process, seconds each: in `make test`, not `make check`.
pytestmark = pytest.mark.slow

SPEC = msgspec.structs.replace(
    MINILM_SPEC, profile=msgspec.structs.replace(MINILM_SPEC.profile, engine="torch")
)


def _profiled(dtype: str) -> ModelSpec:
    return msgspec.structs.replace(SPEC, profile=msgspec.structs.replace(SPEC.profile, dtype=dtype))


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path) -> None:
    with_bf16 = tmp_path / "zen4"
    with_bf16.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16 avx512_vnni\n")
    with_amx = tmp_path / "sapphire"
    with_amx.write_text("flags\t\t: fpu avx512f amx_bf16 amx_tile\n")
    without = tmp_path / "skylake"
    without.write_text("flags\t\t: fpu sse2 avx2 avx512f avx512bw\n")
    assert cpu_has_native_bf16(str(with_bf16))
    assert cpu_has_native_bf16(str(with_amx))
    assert not cpu_has_native_bf16(str(without))
    assert not cpu_has_native_bf16(str(tmp_path / "missing"))


def test_bf16_profile_keeps_cosine_over_the_floor_on_the_perf_texts(
    minilm_path: str, caplog
) -> None:
    texts = load("short")[:96] + load("passages")[:24]
    caplog.set_level(logging.WARNING)
    worst, mean = cosine_vs_float32(_profiled("bfloat16"), minilm_path, texts)
    assert worst >= QUALITY_FLOOR
    assert mean >= worst
    if cpu_has_native_bf16():
        # bf16 really ran: the vectors moved, a little.
        assert worst < 1 - 1e-7
        assert mean > 0.9999
    else:
        # No native bf16: the profile serves float32, exactly, and says so.
        assert worst > 1 - 1e-6
        assert "serving float32" in caplog.text


def test_float32_profile_matches_sentence_transformers(minilm_path: str, st_model) -> None:
    texts = load("short")[:40] + load("passages")[:8]
    adapter = make_adapter(SPEC, "cpu")
    adapter.load(minilm_path)
    ours = embed(adapter, texts, batch=16)
    theirs = st_model.encode(texts, batch_size=16, normalize_embeddings=True)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
