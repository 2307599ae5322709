"""The int8 and int4 tiers: a float32 graph's weights re-quantized into llama.cpp's blocks
(gguf-py's Q8_0 and Q4_1) and served by the kernels that read a GGUF's blocks. The graph
stands for optimum's export (tests/weight_graphs.py); what it serves is checked against
gguf-py's own dequantizing of the same blocks."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
ov = pytest.importorskip("openvino")

from shoal.workers.generation.precision import NATIVE  # noqa: E402
from shoal.workers.generation.requantized import requantize  # noqa: E402
from shoal.workers.generation.weight_guard import EXACT  # noqa: E402
from tests.weight_graphs import (  # noqa: E402
    EMBEDDING,
    assert_serves,
    exported_graph,
    kernel_weights,
)

HIDDEN = 128
Q = gguf.GGMLQuantizationType


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        EMBEDDING: rng.standard_normal((16, HIDDEN)).astype(np.float32) * 0.1,
        "model.layers.0.self_attn.q_proj": rng.standard_normal((64, HIDDEN)).astype(np.float32),
        "model.layers.0.mlp.up_proj": rng.standard_normal((96, HIDDEN)).astype(np.float32) * 0.02,
    }


def _as_blocks(weights: dict[str, np.ndarray], kind_of) -> dict[str, np.ndarray]:
    """Each weight as gguf-py quantizes and dequantizes it: what the tier must serve."""
    out = {}
    for name, w in weights.items():
        kind = Q[kind_of(name)]
        out[name] = gguf.quants.dequantize(gguf.quants.quantize(w, kind), kind).astype(np.float32)
    return out


@pytest.mark.parametrize(
    ("tier", "kind_of", "matmul_codes"),
    [
        ("int8", lambda name: "Q8_0", "i8"),
        ("int4", lambda name: "Q8_0" if name == EMBEDDING else "Q4_1", "u4"),
    ],
)
def test_a_tier_serves_the_blocks_gguf_py_makes_of_each_weight(tier, kind_of, matmul_codes) -> None:
    weights = _weights()
    model = exported_graph(weights, HIDDEN)

    counts = requantize(model, tier)

    compiled = ov.Core().compile_model(model, "CPU", EXACT | NATIVE)
    assert_serves(compiled, _as_blocks(weights, kind_of), HIDDEN, 1e-5)
    kernels = kernel_weights(compiled)
    assert kernels["FullyConnected", matmul_codes] == 2
    assert kernels["Gather", "i8"] == 1  # the embedding: Q8_0 in both tiers
    assert sum(counts.values()) == 3 and "float32" not in counts


def test_rows_that_are_not_whole_blocks_stay_float32() -> None:
    weights = {"model.layers.0.mlp.down_proj": np.ones((8, 40), dtype=np.float32)}
    model = exported_graph(weights, 40)

    assert requantize(model, "int8") == {"float32": 1}
    compiled = ov.Core().compile_model(model, "CPU", EXACT)
    assert kernel_weights(compiled)["FullyConnected", "f32"] == 1


def test_an_unknown_tier_is_refused() -> None:
    with pytest.raises(ValueError, match="int8, int4"):
        requantize(exported_graph(_weights(), HIDDEN), "int2")
