"""`shoal worker`: one encoder worker process."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Coroutine
from typing import Any

from .. import telemetry
from ..config import Settings
from ..model_registry import LiveRegistry, ModelRegistry
from ..queue import Bus, QueueUnavailableError
from .encoder_worker import EncoderWorker

__all__ = ["run_loop", "run_worker", "serve_worker"]

log = logging.getLogger(__name__)


def run_worker(settings: Settings) -> None:
    """Serve `settings.worker.models` until SIGINT or SIGTERM."""
    static = ModelRegistry.from_files(settings.models_file)
    for name in settings.worker.models:
        if name != "*":
            static.resolve(name)  # fail fast on a typo (registered models come later)
    if settings.worker.threads:
        import torch

        torch.set_num_threads(settings.worker.threads)
    run_loop(serve_worker(settings, static))


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop

        uvloop.run(main)
    except ImportError:
        asyncio.run(main)


async def serve_worker(
    settings: Settings,
    static: ModelRegistry,
    worker: type = EncoderWorker,
    service: str = "worker",
) -> None:
    """Run one worker of class `worker` (encoder or generation) until SIGINT/SIGTERM."""
    telemetry.setup(service, settings.telemetry)
    t = settings.telemetry
    running: list[Any] = []  # the worker, once made: /ready answers 200 when it is ready
    if t.metrics_port:
        port = telemetry.serve_metrics(
            t.metrics_host, t.metrics_port, ready=lambda: any(w.state == "ready" for w in running)
        )
        log.info("metrics on http://%s:%d/metrics (probes: /health, /ready)", t.metrics_host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bus = await _connect(settings)
    try:
        registry = LiveRegistry(static, await bus.key_value(settings.nats.registry_bucket))
        await registry.start()
        running.append(worker(settings, bus, registry))
        await running[0].run(stop)
    finally:
        await bus.close()
        telemetry.shutdown()


async def _connect(settings: Settings, attempts: int = 60) -> Bus:
    """Connect, waiting for a nats-server that is still starting."""
    for _ in range(attempts - 1):
        try:
            return await Bus.connect(settings.nats, name="shoal-worker")
        except QueueUnavailableError:
            await asyncio.sleep(0.5)
    return await Bus.connect(settings.nats, name="shoal-worker")
