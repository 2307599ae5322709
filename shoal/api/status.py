"""The gateway's live picture for `/status.json` (the status page) and `/metrics`.

Everything here is read from what the gateway already has: its own request history
(`RequestStats`), the workers' heartbeats (what each serves, holds and runs per second)
and the work consumers' depths (`QueueDepths`).
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from .. import telemetry
from ..queue.depth import QueueDepth, QueueDepths
from ..queue.heartbeat import WorkerHeartbeat
from ..queue.subjects import Subjects
from .admission import Admission
from .gateway import Gateway
from .observe import Observer

__all__ = ["StatusBoard"]

_WINDOW = 60.0
"""Seconds the headline rate and latency percentiles cover."""


class StatusBoard:
    """One per gateway process: builds the status document and exports the queue and
    worker gauges."""

    def __init__(self, gateway: Gateway, observer: Observer, admission: Admission) -> None:
        self.gateway = gateway
        self.observer = observer
        self.admission = admission
        nats = gateway.settings.nats
        self.depths = QueueDepths(gateway.bus, nats.stream, Subjects(nats.subject_prefix))
        meter = telemetry.meter("shoal.gateway")
        meter.create_observable_gauge(
            "shoal.queue.pending",
            callbacks=[self._pending],
            unit="1",
            description="Work items waiting for a worker, per work subject",
        )
        meter.create_observable_gauge(
            "shoal.queue.in_flight",
            callbacks=[self._in_flight],
            unit="1",
            description="Work items held by a worker and not yet acked, per work subject",
        )
        meter.create_observable_gauge(
            "shoal.workers.live",
            callbacks=[lambda _: [Observation(len(gateway.dispatcher.live_workers()))]],
            unit="1",
            description="Workers whose heartbeats this gateway hears",
        )

    async def refresh(self) -> None:
        """Read the queue depths (at most once a second) before a scrape renders them."""
        await self.depths.read()

    def _pending(self, _: CallbackOptions) -> list[Observation]:
        return [Observation(d.pending, _labels(d)) for d in self.depths.latest]

    def _in_flight(self, _: CallbackOptions) -> list[Observation]:
        return [Observation(d.in_flight, _labels(d)) for d in self.depths.latest]

    async def document(self, operator: bool = True) -> dict[str, Any]:
        """What the status page shows; recent errors without their messages unless the
        caller is an `operator` (messages may name keys, server paths, S3 sources)."""
        await self.refresh()
        now = time.time()
        stats = self.observer.stats
        rate, p50, p99 = stats.window(now, _WINDOW)
        workers = self.gateway.dispatcher.live_workers()
        return {
            "now": now,
            "gateway": {
                "id": self.gateway.dispatcher.gateway_id,
                "started_at": self.observer.started_at,
                # What it holds against its bounds (max_in_flight, body bytes in flight).
                "in_flight": self.admission.in_flight,
                "body_bytes_in_flight": self.admission.body_bytes,
            },
            "totals": dict(stats.totals),
            "window_s": _WINDOW,
            "request_rate": rate,
            "latency_ms": {"p50": p50, "p99": p99},
            "series": stats.series(now),
            "step_s": stats.step,
            "models": self._models(workers, stats.by_model),
            "workers": [_worker(beat, now) for beat in workers],
            "queues": [
                {
                    "subject": d.subject,
                    "model": d.model,
                    "lane": d.lane,
                    "pending": d.pending,
                    "in_flight": d.in_flight,
                }
                for d in self.depths.latest
            ],
            "errors": [e if operator else _redacted(e) for e in stats.errors],
        }

    def _models(
        self, workers: list[WorkerHeartbeat], requests: dict[str, int]
    ) -> list[dict[str, Any]]:
        models = []
        engines = self.gateway.dispatcher.engines()
        for spec in self.gateway.registry:
            served_by = [
                b.worker_id
                for b in workers
                # `*` comes from encoder workers (generation workers list their models).
                if spec.id in b.models or ("*" in b.models and "generate" not in spec.tasks)
            ]
            models.append(
                {
                    "id": spec.id,
                    "tasks": sorted(spec.tasks),
                    # What runs it and in which precision, as its workers say (`openvino
                    # float32`); empty until a worker has it resident.
                    "engine": engines.get(spec.id, ""),
                    "resident_on": [b.worker_id for b in workers if spec.id in b.resident],
                    "served_by": served_by,
                    "requests": requests.get(spec.id, 0),
                }
            )
        return models


def _worker(beat: WorkerHeartbeat, now: float) -> dict[str, Any]:
    return {
        "id": beat.worker_id,
        "state": beat.state,
        "models": beat.models,
        "resident": beat.resident,
        "resident_bytes": beat.resident_bytes,
        "engines": beat.engines,
        "memory_budget": beat.memory_budget,
        "batch_fill": beat.batch_fill if beat.batches_per_s else None,
        "batches_per_s": beat.batches_per_s,
        "items_per_s": beat.items_per_s,
        "tokens_per_s": beat.tokens_per_s,
        "forward_busy": round(beat.forward_busy, 3),
        "passes_side_by_side": beat.passes_side_by_side,
        "sequences_drafted": beat.sequences_drafted,
        "drafted_moved": beat.drafted_moved,
        "active": beat.active,
        "age_s": max(0.0, now - beat.sent_at),
    }


def _redacted(error: dict[str, Any]) -> dict[str, Any]:
    return {**error, "message": ""}


def _labels(depth: QueueDepth) -> dict[str, str]:
    return {"subject": depth.subject, "model": depth.model, "lane": depth.lane}
