"""OpenTelemetry for every Shoal process: traces out over OTLP, metrics in Prometheus text.

Traces are off unless the standard variables ask for them (`OTEL_EXPORTER_OTLP_ENDPOINT`
or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, or `OTEL_TRACES_EXPORTER=otlp|console`;
`OTEL_SDK_DISABLED=true` wins). When off, `tracing()` is False and the hot paths skip every
tracing call, so they pay one boolean check. A trace crosses processes as W3C trace
context in the NATS message headers (`inject` / `extract`).

Work that shares a batch belongs to many traces, so workers record timestamps as they go
and write each job's spans when it is settled (`record_span` with explicit times), instead
of juggling one live span per job through the batcher.

Metrics are always on and cheap (in-memory aggregation); `metrics_text()` renders them,
with the process collectors of `prometheus_client` (resident memory, CPU), for
`GET /metrics` on the gateway and each worker's metrics port.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from .config import TelemetrySettings

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "SECONDS_BUCKETS",
    "TOKEN_BUCKETS",
    "extract",
    "inject",
    "meter",
    "metrics_text",
    "record_span",
    "serve_metrics",
    "setup",
    "trace_id",
    "tracer",
    "tracing",
]

log = logging.getLogger(__name__)

SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536, 262144)

_lock = threading.Lock()
_service = ""
_tracing = False
_tracer: trace.Tracer = trace.NoOpTracer()


def setup(service: str, settings: TelemetrySettings) -> None:
    """Configure this process once: `service` is `gateway`, `worker` or `generator`."""
    global _service, _tracing, _tracer
    with _lock:
        if _service:
            return
        _service = service
        otel = settings.otel
        name = otel.get("OTEL_SERVICE_NAME") or f"shoal-{service}"
        resource = Resource.create({"service.name": name, "service.namespace": "shoal"})
        metrics.set_meter_provider(
            MeterProvider(
                resource=resource,
                metric_readers=[PrometheusMetricReader(scope_info_enabled=False)],
                views=_views(),
            )
        )
        exporter = _span_exporter(otel)
        if exporter is not None:
            provider = TracerProvider(resource=resource)
            provider.add_span_processor(BatchSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            _tracer = provider.get_tracer("shoal")
            _tracing = True
            log.info("tracing on: spans of %s go to %s", name, type(exporter).__name__)


def shutdown() -> None:
    """Flush spans still batched (a worker stopping, a test ending)."""
    provider = trace.get_tracer_provider()
    if _tracing and isinstance(provider, TracerProvider):
        provider.force_flush()
        provider.shutdown()


def _span_exporter(env: Mapping[str, str]) -> Any:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    chosen = env.get("OTEL_TRACES_EXPORTER", "otlp" if endpoint else "none").strip().lower()
    if chosen == "console":
        return ConsoleSpanExporter()
    if chosen != "otlp":
        return None
    # OTLP over HTTP/protobuf: no gRPC in the gateway image; it reads the standard
    # OTEL_EXPORTER_OTLP_* variables (endpoint, headers, timeout) itself.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _views() -> list[View]:
    def buckets(unit_name: str, bounds: tuple) -> View:
        return View(
            instrument_name=unit_name,
            aggregation=ExplicitBucketHistogramAggregation(boundaries=bounds),
        )

    return [
        buckets("shoal.*duration", SECONDS_BUCKETS),
        buckets("shoal.*time_to_first_token", SECONDS_BUCKETS),
        buckets("shoal.*inter_token_latency", SECONDS_BUCKETS),
        buckets("shoal.*.batch.size", BATCH_SIZE_BUCKETS),
        buckets("shoal.*.batch.tokens", TOKEN_BUCKETS),
    ]


def tracing() -> bool:
    """Whether spans are recorded in this process (checked before any tracing work)."""
    return _tracing


def tracer() -> trace.Tracer:
    return _tracer


def meter(name: str) -> metrics.Meter:
    """A meter; before `setup` (unit tests) it is the API's no-op one."""
    return metrics.get_meter(name)


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current trace context (`traceparent`, `tracestate`) to message headers."""
    propagate.inject(headers)


def extract(headers: Mapping[str, str] | None) -> Context | None:
    """The trace context a message carried; None when it carried none."""
    if not headers or "traceparent" not in headers:
        return None
    return propagate.extract(headers)


def record_span(
    name: str,
    start: float,
    end: float,
    parent: Context | trace.Span | None,
    attributes: Mapping[str, Any] | None = None,
    kind: trace.SpanKind = trace.SpanKind.INTERNAL,
) -> trace.Span:
    """A span over `start`..`end` (Unix seconds) that already happened, under `parent`
    (a context from `extract` or a span). Returns it (ended) so children can name it."""
    if isinstance(parent, trace.Span):
        parent = trace.set_span_in_context(parent)
    span = _tracer.start_span(
        name, context=parent, kind=kind, attributes=attributes, start_time=int(start * 1e9)
    )
    span.end(end_time=int(max(end, start) * 1e9))
    return span


def trace_id() -> str:
    """The current trace's id in hex, or "" outside a recorded span (for logs)."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""


def metrics_text() -> tuple[bytes, str]:
    """The Prometheus text exposition of this process's metrics, and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes and scrapes every few seconds are not worth a log line each."""


def serve_metrics(host: str, port: int, ready: Callable[[], bool] = lambda: True) -> int:
    """Serve `/metrics` on its own small HTTP port (workers), with `/health` (200 while
    the process runs) and `/ready` (200 once `ready()`, else 503) for orchestrators'
    probes. Returns the port bound."""
    metrics_app = make_wsgi_app(REGISTRY)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in ("/health", "/ready"):
            return metrics_app(environ, start_response)
        ok = path == "/health" or ready()
        start_response(
            "200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")]
        )
        return [b"ok\n" if ok else b"not ready\n"]

    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server.server_address[1]
