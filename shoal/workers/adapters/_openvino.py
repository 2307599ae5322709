"""The OpenVINO engine: a torch model's forward graph, compiled for the CPU.

The shipped profile (`engine = "auto"`, where this passes its load-time check against
float32 torch) and `engine = "openvino"` keep the adapter's torch model (LoRA adapters and
the ops without a graph still run there) and convert its main forward once, at load, into
an OpenVINO model with dynamic batch and length. OpenVINO fuses the graph for the CPU and, with
`dtype = "bfloat16"` where the CPU has native bf16, runs it in bf16 (AMX or AVX512-BF16):
on MiniLM it measured 1.3x torch's bf16 autocast at the same cosine to float32 (0.9999+,
perf/results/README.md).

OpenVINO fixes its thread count when it compiles, and the worker changes a forward's
threads between lanes (batch-lane passes take half while live traffic is about), so a
compiled model is made per thread count on first use (0.2-1 s for MiniLM) and kept.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping

import numpy as np
import torch

__all__ = ["OpenVinoGraph", "available"]

log = logging.getLogger(__name__)


def available() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


class OpenVinoGraph:
    """`module(**inputs)` (int64 arrays of shape (rows, tokens), one float output) in
    OpenVINO."""

    def __init__(self, module: torch.nn.Module, inputs: Mapping[str, np.ndarray], bf16: bool):
        import openvino as ov

        self.names = list(inputs)
        example = tuple(torch.from_numpy(inputs[name]) for name in self.names)
        # The tracer warns of Python branches on shapes (transformers' attention-mask
        # checks); for these encoders they take the same side at every shape, which the
        # tests check by comparing varied batches with torch.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            self._model = ov.convert_model(
                module, example_input=example, input=[ov.PartialShape([-1, -1])] * len(example)
            )
        self._core = ov.Core()
        self.precision = "bf16" if bf16 else "f32"
        self._requests: dict[int, ov.InferRequest] = {}

    def __call__(self, inputs: Mapping[str, np.ndarray], threads: int) -> np.ndarray:
        request = self._requests.get(threads)
        if request is None:
            request = self._compile(threads)
        request.infer([inputs[name] for name in self.names])
        # The request reuses its output buffer on the next call: copy out.
        return np.array(request.get_output_tensor(0).data, dtype=np.float32)

    def _compile(self, threads: int):
        config = {
            "INFERENCE_PRECISION_HINT": self.precision,
            # One stream on all the given threads: the worker sends one batch at a time.
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_NUM_THREADS": max(0, threads),
        }
        compiled = self._core.compile_model(self._model, "CPU", config)
        log.info("OpenVINO: compiled for %d threads in %s", threads, self.precision)
        request = self._requests[threads] = compiled.create_infer_request()
        return request

    @property
    def compiled(self) -> int:
        """How many thread counts it holds a compiled copy for."""
        return len(self._requests)
