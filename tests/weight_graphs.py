"""An OpenVINO graph shaped like optimum's export of a causal LM (named float32 weight
constants into MatMul, the embedding's into Gather), and what a compiled model's kernels
read: for the tests of the weights the native tier puts back (GGUF blocks, 16-bit
weights), in a graph of their own or a served model's IR."""

from __future__ import annotations

from collections import Counter

import numpy as np
import openvino as ov
from openvino import opset13 as ops

EMBEDDING = "model.embed_tokens"


def exported_graph(exported: dict[str, np.ndarray], hidden: int) -> ov.Model:
    """`self.<name>.weight` constants: the embedding's gathered by `ids`, every other
    weight multiplying `x`; each output in `exported`'s order."""
    x = ops.parameter([-1, hidden], ov.Type.f32, name="x")
    ids = ops.parameter([-1], ov.Type.i64, name="ids")
    outputs = []
    for name, w in exported.items():
        const = ops.constant(w)
        const.set_friendly_name(f"self.{name}.weight")
        if name == EMBEDDING:
            outputs.append(ops.gather(const, ids, 0))
        else:
            outputs.append(ops.matmul(x, const, False, True))
    return ov.Model([o.output(0) for o in outputs], [x, ids], "tiny")


def assert_serves(compiled, exported: dict[str, np.ndarray], hidden: int, rtol: float) -> None:
    """Each output of `compiled` (an `exported_graph`) equals `exported`'s weights'
    within `rtol` of its largest value."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, hidden)).astype(np.float32)
    ids = np.array([0, 3, 7, 1], dtype=np.int64)
    served = compiled({"x": x, "ids": ids})
    for k, (name, w) in enumerate(exported.items()):
        want = w[ids] if name == EMBEDDING else x @ w.T
        got = served[compiled.outputs[k]]
        np.testing.assert_allclose(got, want, rtol=0, atol=rtol * np.abs(want).max(), err_msg=name)


def kernel_weights(compiled) -> Counter:
    """(kernel, weight type) -> how many: what the compiled FullyConnected and Gather
    kernels read."""
    weights: Counter = Counter()
    for op in compiled.get_runtime_model().get_ops():
        kind = op.get_rt_info()["layerType"].astype(str)
        if kind in ("FullyConnected", "Gather"):
            port = 1 if kind == "FullyConnected" else 0
            weights[kind, op.input(port).get_element_type().get_type_name()] += 1
    return weights
