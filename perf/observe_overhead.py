"""What observability costs per request and per batch, in process (no servers).

    .venv/bin/python perf/observe_overhead.py [--n 50000]

Times the gateway's per-request record (latency histogram + status-page history), the
encoder worker's per-batch metrics, and a traced job's spans (five spans written after the
fact, with an in-memory exporter), each as microseconds per call, median of 5 rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shoal import telemetry
from shoal.api.observe import Observer, RequestInfo
from shoal.config import TelemetrySettings
from shoal.workers.observe import WorkerMetrics, record_job_spans


def _per_call(fn, n: int) -> float:
    rounds = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - started) / n * 1e6)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=50_000)
    n = parser.parse_args().n
    telemetry.setup("gateway", TelemetrySettings())
    observer = Observer()
    info = RequestInfo()
    info.model = "all-MiniLM-L6-v2"
    worker = WorkerMetrics("encoder")
    rows = [
        (
            "gateway: one request's record",
            _per_call(lambda: observer.record("POST", "/v1/embeddings", info, 200, 0.01, b""), n),
        ),
        (
            "worker: one batch's metrics",
            _per_call(lambda: worker.batch("all-MiniLM-L6-v2", "embed", 32, 1024, 0.05, 0.1), n),
        ),
        ("tracing off: the hot path's check", _per_call(telemetry.tracing, n)),
    ]
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    tracer = provider.get_tracer("perf")
    telemetry._tracer = tracer  # the module's tracer, as `setup` sets it when tracing is on
    parent = trace.set_span_in_context(tracer.start_span("gateway"))
    now = time.time()
    stages = [(f"stage-{i}", now, now + 0.001, {}) for i in range(4)]
    rows.append(
        (
            "tracing on: one job's six spans (in-memory exporter)",
            _per_call(lambda: record_job_spans(parent, now, now, now + 0.01, {}, stages), n // 10),
        )
    )
    print("| what | us per call |\n|---|---|")
    for what, us in rows:
        print(f"| {what} | {us:.2f} |")


if __name__ == "__main__":
    main()
