"""The observability parts on their own: when tracing is on, the status page's request
history, and the JSON log lines."""

from __future__ import annotations

import json
import logging

import pytest

from shoal.api.observe import RequestStats
from shoal.logs import JsonFormatter, current_request_id
from shoal.telemetry import _span_exporter


def test_tracing_is_off_unless_the_standard_variables_ask() -> None:
    assert _span_exporter({}) is None
    assert _span_exporter({"OTEL_TRACES_EXPORTER": "none"}) is None
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert type(_span_exporter(endpoint)).__name__ == "OTLPSpanExporter"
    assert _span_exporter({**endpoint, "OTEL_SDK_DISABLED": "true"}) is None
    assert _span_exporter({**endpoint, "OTEL_TRACES_EXPORTER": "none"}) is None
    assert type(_span_exporter({"OTEL_TRACES_EXPORTER": "console"})).__name__ == (
        "ConsoleSpanExporter"
    )


def test_request_stats_keep_rates_percentiles_and_a_bounded_sample() -> None:
    stats = RequestStats(step=2.0, points=10, samples=50)
    now = 1000.0
    for i in range(1000):  # 1000 requests in one bucket: 1 ms .. 1000 ms
        stats.record(now, "m", 200 if i % 10 else 503, (i + 1) / 1000)
    assert len(stats.buckets[-1].latencies) == 50
    rate, p50, p99 = stats.window(now + 1, 20.0)
    assert rate == pytest.approx(1000 / 20)
    assert p50 is not None and p99 is not None and p50 < p99 <= 1000
    assert 150 < p50 < 850  # a uniform sample's median, not the first 50 requests
    assert stats.totals == {"requests": 1000, "errors": 100, "rate_limited": 0, "rejected": 0}
    assert stats.by_model == {"m": 1000}
    series = stats.series(now + 7)
    assert len(series) == 10 and [p["t"] for p in series] == sorted(p["t"] for p in series)
    [busy] = [p for p in series if p["requests"]]
    assert busy["errors"] == 100 and busy["rate"] == 500
    assert series[-1]["requests"] == 0 and series[-1]["p50_ms"] is None


def test_log_lines_are_json_with_the_request_id_and_no_surprises() -> None:
    formatter = JsonFormatter()
    record = logging.LogRecord(
        "shoal.api", logging.WARNING, __file__, 1, 'said "%s"\nthen left', ("hi",), None
    )
    token = current_request_id.set("gw-7")
    try:
        line = formatter.format(record)
    finally:
        current_request_id.reset(token)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == 'said "hi"\nthen left'
    assert (entry["level"], entry["logger"], entry["request_id"]) == (
        "warning",
        "shoal.api",
        "gw-7",
    )
    assert entry["ts"].endswith("Z") and "trace_id" not in entry  # no span: no trace id
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    assert "ValueError: boom" in json.loads(formatter.format(record))["exception"]
    assert "request_id" not in json.loads(formatter.format(record))


def test_the_metrics_port_answers_probes_from_the_ready_callable() -> None:
    import httpx

    from shoal.telemetry import serve_metrics

    ready = [False]
    port = serve_metrics("127.0.0.1", 0, ready=lambda: ready[0])
    base = f"http://127.0.0.1:{port}"
    assert httpx.get(f"{base}/health").status_code == 200
    assert httpx.get(f"{base}/ready").status_code == 503
    ready[0] = True
    assert httpx.get(f"{base}/ready").status_code == 200
    metrics = httpx.get(f"{base}/metrics")
    assert metrics.status_code == 200 and "# TYPE" in metrics.text
