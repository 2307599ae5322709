"""`shoal worker`: one encoder worker process."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from .. import telemetry
from ..config import Settings
from ..lifecycle import StopSignals, exit_leaving_threads, run_until_stopped
from ..model_registry import LiveRegistry, ModelRegistry
from ..queue import Bus
from .encoder.worker import EncoderWorker

__all__ = ["run_loop", "run_worker", "serve_worker"]

log = logging.getLogger(__name__)


def run_worker(settings: Settings) -> None:
    """Serve `settings.worker.models` until SIGINT or SIGTERM."""
    static = ModelRegistry.from_files(*settings.spec_files)
    for name in settings.worker.models:
        if name != "*":
            static.resolve(name)  # fail fast on a typo (registered models come later)
    if settings.worker.threads:
        import torch

        torch.set_num_threads(settings.worker.threads)
    run_loop(serve_worker(settings, static))


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run a worker's main coroutine; at its end, exit without waiting for a thread
    still loading or converting a model (a stop during loading must not wait for it)."""
    try:
        import uvloop

        uvloop.run(main)
    except ImportError:
        asyncio.run(main)
    exit_leaving_threads()


async def serve_worker(
    settings: Settings,
    static: ModelRegistry,
    worker: type = EncoderWorker,
    service: str = "worker",
) -> None:
    """Run one worker of class `worker` (encoder or generation) until SIGINT/SIGTERM,
    which stops it in every phase (see shoal/lifecycle.py)."""
    signals = StopSignals().install()
    telemetry.setup(service, settings.telemetry)
    t = settings.telemetry
    running: list[Any] = []  # the worker, once made: /ready answers 200 when it is ready
    if t.metrics_port:
        port = telemetry.serve_metrics(
            t.metrics_host, t.metrics_port, ready=lambda: any(w.state == "ready" for w in running)
        )
        log.info("metrics on http://%s:%d/metrics (probes: /health, /ready)", t.metrics_host, port)
    stop = signals.event

    async def main() -> None:
        bus = await Bus.open(settings.nats, name=f"shoal-{service}")
        try:
            registry = LiveRegistry(static, await bus.key_value(settings.nats.registry_bucket))
            await registry.start()
            running.append(worker(settings, bus, registry))
            await running[0].run(stop)
        finally:
            await bus.close()

    try:
        await run_until_stopped(main(), stop, lambda: any(w.state == "ready" for w in running))
    finally:
        telemetry.shutdown()
