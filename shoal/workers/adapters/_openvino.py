"""The OpenVINO engine: a torch model's forward graph, compiled for the CPU.

The shipped profile (`engine = "auto"`, where this passes its load-time check against
float32 torch) and `engine = "openvino"` keep the adapter's torch model (LoRA adapters and
the ops without a graph still run there) and convert its main forward once, at load, into
an OpenVINO model with dynamic batch and length. OpenVINO fuses the graph for the CPU and, with
`dtype = "bfloat16"` where the CPU has native bf16, runs it in bf16 (AMX or AVX512-BF16):
faster than torch's bf16 autocast at the same cosine to float32 (perf/results/README.md).

OpenVINO fixes its thread count when it compiles, and the worker changes a forward's
threads between lanes (batch-lane passes take half while live traffic is about), so a
compiled model is made per thread count on first use (well under a second) and kept.

Under load the worker runs two passes at once (`side_by_side`): one compiled model with
two streams of half the threads each, one infer request per forward thread. On a CPU
shared with the gateway, NATS and clients, a pass on all threads waits at every layer for
its slowest thread, and a thread preempted by another process stalls them all; two passes
of one thread each lose only their own time (measured in perf/results/README.md: a gain
beside a busy process, about none on an idle machine). Two separately compiled 1-thread
models instead share one core (OpenVINO pins each to the first), at half the speed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import torch

from ._graph_cache import cached_graph

__all__ = ["OpenVinoGraph", "available", "side_by_side"]

log = logging.getLogger(__name__)

_pass = threading.local()
"""How the forward thread's current pass runs: `streams` 2 while another runs beside it."""


@contextlib.contextmanager
def side_by_side(threads: int) -> Iterator[None]:
    """Run this thread's passes in one of two streams sharing `threads`, beside another
    forward thread's."""
    _pass.streams, _pass.threads = 2, threads
    try:
        yield
    finally:
        _pass.streams = 1


def available() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


class OpenVinoGraph:
    """`module(**inputs)` (int64 arrays of shape (rows, tokens), one float output) in
    OpenVINO; converted once per `cache_dir` (see `_graph_cache`)."""

    def __init__(
        self,
        module: torch.nn.Module,
        inputs: Mapping[str, np.ndarray],
        bf16: bool,
        cache_dir: Path | None = None,
    ):
        import openvino as ov

        self.names = list(inputs)

        def convert() -> ov.Model:
            example = tuple(torch.from_numpy(inputs[name]) for name in self.names)
            # The tracer warns of Python branches on shapes (transformers' attention-mask
            # checks); for these encoders they take the same side at every shape, which
            # the tests check by comparing varied batches with torch.
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                return ov.convert_model(
                    module,
                    example_input=example,
                    input=[ov.PartialShape([-1, -1])] * len(example),
                )

        self._model = cached_graph(cache_dir, module, self.names, convert)
        self._core = ov.Core()
        self.precision = "bf16" if bf16 else "f32"
        self._compiled: dict[tuple[int, int], ov.CompiledModel] = {}
        self._requests: dict[tuple[int, int, int], ov.InferRequest] = {}
        self._lock = threading.Lock()

    def __call__(self, inputs: Mapping[str, np.ndarray], threads: int) -> np.ndarray:
        """On one stream of `threads`, or inside `side_by_side` on one of its streams."""
        streams = getattr(_pass, "streams", 1)
        if streams > 1:
            threads = _pass.threads
        key = (threads, streams, threading.get_ident())
        request = self._requests.get(key)
        if request is None:
            request = self._request(threads, streams)
            self._requests[key] = request
        request.infer([inputs[name] for name in self.names])
        # The request reuses its output buffer on the next call: copy out.
        return np.array(request.get_output_tensor(0).data, dtype=np.float32)

    def _request(self, threads: int, streams: int):
        """An infer request of the model compiled for `threads` in `streams` streams (two
        forward threads may ask at once)."""
        with self._lock:
            compiled = self._compiled.get((threads, streams))
            if compiled is None:
                config = {"INFERENCE_PRECISION_HINT": self.precision}
                if streams == 1:  # one stream on all the threads: one batch at a time
                    config |= {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}
                else:
                    config |= {"NUM_STREAMS": streams, "INFERENCE_NUM_THREADS": threads}
                compiled = self._core.compile_model(self._model, "CPU", config)
                self._compiled[(threads, streams)] = compiled
                log.info(
                    "OpenVINO: compiled for %d threads in %d stream(s), %s",
                    threads,
                    streams,
                    self.precision,
                )
            return compiled.create_infer_request()

    @property
    def compiled(self) -> int:
        """How many compiled copies it holds (one per thread count and stream count)."""
        return len(self._compiled)
