"""16-bit weights put back into an OpenVINO graph as 16-bit constants (float16_weights.py).

The graph stands for optimum's export of a 16-bit checkpoint: named float32 constants
into MatMul and the embedding's Gather, whose values are exactly f16 or bf16 (a checkpoint
widened), beside one whose values are not (a float32 checkpoint's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ov = pytest.importorskip("openvino")

from shoal.workers.generation.float16_weights import (  # noqa: E402
    mark_decompression,
    sixteen_bit_weights,
)
from shoal.workers.generation.weight_guard import EXACT  # noqa: E402
from tests.weight_graphs import (  # noqa: E402
    assert_serves,
    exported_graph,
    kernel_weights,
)

HIDDEN, VOCAB = 64, 32


def _bf16(w: np.ndarray) -> np.ndarray:
    """`w` rounded to bf16 values (truncated: float32's upper half), as float32."""
    return (w.view(np.uint32) & 0xFFFF0000).view(np.float32)


@pytest.fixture(scope="module")
def exported() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)

    def weights(rows: int) -> np.ndarray:
        return (rng.standard_normal((rows, HIDDEN)) * 0.02).astype(np.float32)

    def bf16_weights(rows: int) -> np.ndarray:
        """bf16 values, a few too small for f16 to hold: a bf16 checkpoint (its values
        within f16's normal range are f16 values too)."""
        w = weights(rows)
        w[0, :4] = [1e-7, -3e-8, 2.5e-9, 1e-6]
        return _bf16(w)

    return {
        "model.layers.0.mlp.up_proj": weights(96).astype(np.float16).astype(np.float32),
        "model.layers.0.mlp.down_proj": bf16_weights(48),
        "model.embed_tokens": bf16_weights(VOCAB),
        "lm_head": weights(VOCAB),  # float32 values: kept
    }


def test_16_bit_weights_serve_as_16_bit_and_compute_what_float32_did(
    exported, tmp_path: Path
) -> None:
    model = exported_graph(exported, HIDDEN)
    assert sixteen_bit_weights(model) == {"F16": 1, "BF16": 2}
    xml = tmp_path / "openvino_model.xml"
    ov.save_model(model, str(xml), compress_to_fp16=False)
    assert mark_decompression(xml) == 3  # each Convert of a 16-bit weight

    compiled = ov.Core().compile_model(str(xml), "CPU", EXACT)
    # The same weights in float32 arithmetic: equal but for the order of the sums.
    assert_serves(compiled, exported, HIDDEN, 1e-6)
    # The compiled kernels read the 16-bit weights, not a float32 copy.
    weights = kernel_weights(compiled)
    assert weights == {
        ("FullyConnected", "f16"): 1,
        ("FullyConnected", "bf16"): 1,
        ("FullyConnected", "f32"): 1,
        ("Gather", "bf16"): 1,
    }


def test_a_float32_checkpoint_keeps_every_weight(exported) -> None:
    model = exported_graph({"lm_head": exported["lm_head"]}, HIDDEN)
    assert sixteen_bit_weights(model) == {}
