"""What a worker tells operators: metrics per batch, throughput for its heartbeats, and
each job's spans.

Metrics (OpenTelemetry, rendered in Prometheus text on the worker's metrics port): batch
size and tokens per batch, forward-pass time, inputs and tokens run (their rates are
tokens/s), model loads, evictions and resident bytes; for generation, time to first
token and inter-token latency.

Spans are written when a job is settled, from the timestamps its holder kept (a batch
mixes many traces): `shoal.queue.wait` (publish to pull) and `shoal.worker.job` under the
gateway's span, and under the job its stages.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import Observation

from .. import telemetry

__all__ = ["Stage", "WorkerMetrics", "job_context", "record_job_spans"]

_RATE_WINDOW = 5.0
"""Seconds the heartbeat's throughput figures average over."""


class WorkerMetrics:
    """A worker's metrics, and the throughput its heartbeats report."""

    def __init__(self, kind: str, memory: Callable[[], tuple[int, int, int]] | None = None):
        """`kind`: `encoder` or `generator`. `memory()`: resident bytes, loads, evictions."""
        meter = telemetry.meter(f"shoal.{kind}")
        self.batch_size = meter.create_histogram(
            "shoal.worker.batch.size", unit="1", description="Inputs per forward pass"
        )
        self.batch_tokens = meter.create_histogram(
            "shoal.worker.batch.tokens",
            unit="1",
            description="Tokens per forward pass, padding included",
        )
        self.forward = meter.create_histogram(
            "shoal.worker.forward.duration", unit="s", description="Forward pass time"
        )
        self.items = meter.create_counter(
            "shoal.worker.inputs", unit="1", description="Inputs run through a model"
        )
        self.tokens = meter.create_counter(
            "shoal.worker.tokens",
            unit="1",
            description="Tokens run (prompt tokens; generated tokens for generation)",
        )
        self.ttft = meter.create_histogram(
            "shoal.generation.time_to_first_token",
            unit="s",
            description="From publish to the first generated token",
        )
        self.inter_token = meter.create_histogram(
            "shoal.generation.inter_token_latency",
            unit="s",
            description="Between generated tokens of one sequence",
        )
        if memory is not None:
            meter.create_observable_gauge(
                "shoal.worker.resident_memory",
                callbacks=[lambda _: [Observation(memory()[0])]],
                unit="By",
                description="Bytes of models held resident",
            )
            meter.create_observable_counter(
                "shoal.worker.model_loads",
                callbacks=[lambda _: [Observation(memory()[1])]],
                unit="1",
                description="Models loaded",
            )
            meter.create_observable_counter(
                "shoal.worker.model_evictions",
                callbacks=[lambda _: [Observation(memory()[2])]],
                unit="1",
                description="Models evicted to make room",
            )
        self._recent: deque[tuple[float, int, int, float]] = deque()
        """(when, inputs, tokens, fill) of recent batches, for the heartbeat's rates."""

    def batch(
        self, model: str, op: str, size: int, tokens: int, seconds: float, fill: float
    ) -> None:
        """A forward pass of `size` inputs and `tokens` (padded) tokens ran in `seconds`;
        `fill`: its share of the batch's token budget."""
        labels = {"model": model, "op": op}
        self.batch_size.record(size, labels)
        self.batch_tokens.record(tokens, labels)
        self.forward.record(seconds, labels)
        self.items.add(size, labels)
        self.tokens.add(tokens, labels)
        self._recent.append((time.monotonic(), size, tokens, fill))

    def generated(self, model: str, tokens: int) -> None:
        labels = {"model": model, "op": "generate"}
        self.tokens.add(tokens, labels)
        self._recent.append((time.monotonic(), 0, tokens, 0.0))

    def rates(self) -> dict[str, float]:
        """The heartbeat's throughput fields: batches/s, inputs/s, tokens/s and the mean
        batch fill of the last few seconds."""
        now = time.monotonic()
        while self._recent and self._recent[0][0] < now - _RATE_WINDOW:
            self._recent.popleft()
        batches = [r for r in self._recent if r[1]]
        return {
            "batches_per_s": len(batches) / _RATE_WINDOW,
            "items_per_s": sum(r[1] for r in self._recent) / _RATE_WINDOW,
            "tokens_per_s": sum(r[2] for r in self._recent) / _RATE_WINDOW,
            "batch_fill": sum(r[3] for r in batches) / len(batches) if batches else 0.0,
        }


def job_context(headers: Mapping[str, str] | None) -> Context | None:
    """The trace a pulled item continues; None when tracing is off or it carries none."""
    return telemetry.extract(headers) if telemetry.tracing() else None


Stage = tuple[str, float, float, dict[str, Any]]
"""(span name, start, end, attributes) of a stage of a job, in Unix seconds."""


def record_job_spans(
    parent: Context,
    published_at: float,
    pulled_at: float,
    ended_at: float,
    attributes: dict[str, Any],
    stages: list[Stage],
) -> None:
    """Write a settled job's spans under the gateway's span (`parent`)."""
    telemetry.record_span("shoal.queue.wait", published_at, pulled_at, parent, attributes)
    job = telemetry.record_span(
        "shoal.worker.job", pulled_at, ended_at, parent, attributes, trace.SpanKind.CONSUMER
    )
    for name, start, end, extra in stages:
        if end > 0:
            telemetry.record_span(name, start, end, job, extra)
