"""What the gateway sees of each request: its span, its metrics, the status page's numbers.

The outermost middleware: it times every routed request (streams to their last chunk),
reads the status it got and, for errors, the OpenAI error code, and records them three
ways:

- a server span (when tracing is on), current while the request runs, so the work it
  publishes carries its trace context to the workers;
- OpenTelemetry metrics: requests and latency by route, model and status; rate-limited
  and rejected counts;
- `RequestStats`, the recent history the status page draws (per-2-second buckets, latency
  samples, the last errors).

Handlers name the model a request runs on through `note_request` (only resolved model
ids become labels, so a client cannot blow up the metrics' cardinality with made-up ones).
"""

from __future__ import annotations

import contextvars
import random
import time
from collections import deque
from typing import Any

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import trace

from .. import telemetry
from ..logs import current_request_id

__all__ = ["ObserveMiddleware", "Observer", "RequestInfo", "RequestStats", "note_request"]

_UNWATCHED = frozenset({"/metrics", "/status", "/status.json", "/health", "/ready"})
"""Monitoring routes: scrapes are not traffic."""
_REJECTED_CODES = frozenset({"backlog_too_long", "gateway_busy", "queue_full", "no_worker"})
_ERROR_BODY_LIMIT = 4096


class RequestInfo:
    """Filled in by handlers while a request runs; read by the middleware at its end."""

    __slots__ = ("model", "request_id")

    def __init__(self) -> None:
        self.model = ""
        self.request_id = ""


current_request: contextvars.ContextVar[RequestInfo | None] = contextvars.ContextVar(
    "shoal_request", default=None
)


def note_request(model: str, request_id: str) -> None:
    """The current request runs on `model` (a resolved id) as `request_id`."""
    info = current_request.get()
    if info is None:
        return  # a batch line, run outside any HTTP request
    info.model = model
    info.request_id = request_id
    current_request_id.set(request_id)  # this request's task only: its logs carry it
    if telemetry.tracing():
        span = trace.get_current_span()
        span.set_attribute("shoal.model", model)
        span.set_attribute("shoal.request_id", request_id)


class _Bucket:
    __slots__ = ("errors", "latencies", "requests", "seen", "t")

    def __init__(self, t: float) -> None:
        self.t = t
        self.requests = 0
        self.errors = 0
        self.seen = 0
        self.latencies: list[float] = []


class RequestStats:
    """Recent traffic in `step`-second buckets (`points` of them), with a bounded sample
    of latencies per bucket (reservoir sampling), totals and the last errors."""

    def __init__(
        self, step: float = 2.0, points: int = 150, samples: int = 256, errors: int = 50
    ) -> None:
        self.step = step
        self.samples = samples
        self.buckets: deque[_Bucket] = deque(maxlen=points)
        self.totals = {"requests": 0, "errors": 0, "rate_limited": 0, "rejected": 0}
        self.by_model: dict[str, int] = {}
        self.errors: deque[dict[str, Any]] = deque(maxlen=errors)

    def _bucket(self, now: float) -> _Bucket:
        t = now - now % self.step
        if not self.buckets or self.buckets[-1].t < t:
            self.buckets.append(_Bucket(t))
        return self.buckets[-1]

    def record(self, now: float, model: str, status: int, seconds: float) -> None:
        bucket = self._bucket(now)
        bucket.requests += 1
        bucket.seen += 1
        if len(bucket.latencies) < self.samples:
            bucket.latencies.append(seconds)
        else:
            slot = random.randrange(bucket.seen)
            if slot < self.samples:
                bucket.latencies[slot] = seconds
        self.totals["requests"] += 1
        if status >= 400:
            bucket.errors += 1
            self.totals["errors"] += 1
        if model:
            self.by_model[model] = self.by_model.get(model, 0) + 1

    def record_error(self, entry: dict[str, Any], rate_limited: bool, rejected: bool) -> None:
        self.errors.appendleft(entry)
        if rate_limited:
            self.totals["rate_limited"] += 1
        if rejected:
            self.totals["rejected"] += 1

    def window(self, now: float, seconds: float) -> tuple[float, float | None, float | None]:
        """Requests per second, p50 and p99 latency (ms) over the last `seconds`."""
        recent = [b for b in self.buckets if b.t > now - seconds]
        count = sum(b.requests for b in recent)
        latencies = [x for b in recent for x in b.latencies]
        p50, p99 = _percentiles(latencies)
        return count / seconds, p50, p99

    def series(self, now: float) -> list[dict[str, Any]]:
        """One point per bucket, oldest first, with empty buckets filled in."""
        by_t = {b.t: b for b in self.buckets}
        last = now - now % self.step
        points = []
        for i in range(self.buckets.maxlen or 0, 0, -1):
            t = last - (i - 1) * self.step
            bucket = by_t.get(t)
            p50, p99 = _percentiles(bucket.latencies if bucket else [])
            requests = bucket.requests if bucket else 0
            points.append(
                {
                    "t": t,
                    "requests": requests,
                    "errors": bucket.errors if bucket else 0,
                    "rate": requests / self.step,
                    "p50_ms": p50,
                    "p99_ms": p99,
                }
            )
        return points


def _percentiles(latencies: list[float]) -> tuple[float | None, float | None]:
    if not latencies:
        return None, None
    ordered = sorted(latencies)
    last = len(ordered) - 1
    return ordered[round(0.5 * last)] * 1000, ordered[round(0.99 * last)] * 1000


class _ErrorBody(msgspec.Struct):
    error: dict[str, Any]


class Observer:
    """State the middleware instances share (Litestar builds one per route handler)."""

    def __init__(self) -> None:
        self.started_at = time.time()
        self.stats = RequestStats()
        meter = telemetry.meter("shoal.gateway")
        # One instrument per request, not a counter beside it: its `_count` is the request
        # count, and each OpenTelemetry SDK record costs ~8-15 us on this machine.
        self.duration = meter.create_histogram(
            "shoal.gateway.request.duration",
            unit="s",
            description="HTTP requests answered and their time to the response's last byte",
        )
        self.rate_limited = meter.create_counter(
            "shoal.gateway.rate_limited", unit="1", description="Requests refused: key limits"
        )
        self.rejected = meter.create_counter(
            "shoal.gateway.rejected",
            unit="1",
            description="Requests refused for capacity (backlog, queue, busy, no worker)",
        )

    def record(
        self, method: str, route: str, info: RequestInfo, status: int, seconds: float, body: bytes
    ) -> None:
        now = time.time()
        labels = {"route": route, "method": method, "model": info.model, "status": str(status)}
        self.duration.record(seconds, labels)
        self.stats.record(now, info.model, status, seconds)
        if status < 400:
            return
        code, message = _error_of(body)
        rate_limited = status == 429 and code == "rate_limit_exceeded"
        rejected = not rate_limited and (status in (429, 503) and code in _REJECTED_CODES)
        if rate_limited:
            self.rate_limited.add(1, {"route": route})
        elif rejected:
            self.rejected.add(1, {"route": route, "code": code})
        self.stats.record_error(
            {
                "at": now,
                "method": method,
                "route": route,
                "status": status,
                "code": code,
                "message": message[:300],
                "request_id": info.request_id,
            },
            rate_limited,
            rejected,
        )


def _error_of(body: bytes) -> tuple[str, str]:
    try:
        error = msgspec.json.decode(body, type=_ErrorBody).error
    except msgspec.DecodeError:
        return "", ""
    return str(error.get("code") or ""), str(error.get("message") or "")


class ObserveMiddleware:
    """Times and counts every request, whatever answered it."""

    def __init__(self, app: Any, observer: Observer) -> None:
        self.app = app
        self.observer = observer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        route = scope.get("path_template") or scope["path"]
        if scope["type"] != "http" or route in _UNWATCHED:
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        info = RequestInfo()
        token = current_request.set(info)
        status = 500  # unless a response starts
        error_body = bytearray()

        async def sending(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif status >= 400 and len(error_body) < _ERROR_BODY_LIMIT:
                error_body.extend(message.get("body", b""))
            await send(message)

        span = attached = None
        if telemetry.tracing():
            span, attached = _start_span(scope, method, route)
        started = time.perf_counter()
        try:
            await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - started
            current_request.reset(token)
            self.observer.record(method, route, info, status, seconds, bytes(error_body))
            if span is not None:
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(trace.StatusCode.ERROR)
                span.end()
                otel_context.detach(attached)


def _start_span(scope: Any, method: str, route: str) -> tuple[trace.Span, object]:
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    parent = telemetry.extract(headers)  # a client's own trace, when it sends one
    span = telemetry.tracer().start_span(
        f"{method} {route}",
        context=parent,
        kind=trace.SpanKind.SERVER,
        attributes={"http.request.method": method, "http.route": route},
    )
    return span, otel_context.attach(trace.set_span_in_context(span))
