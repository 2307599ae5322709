"""`shoal worker --kind generate`: one generation worker process."""

from __future__ import annotations

import asyncio
import signal

from ...config import Settings
from ...model_registry import LiveRegistry, ModelRegistry
from ..main import _connect, _run
from .worker import GenerationWorker

__all__ = ["run_generation_worker"]


def run_generation_worker(settings: Settings) -> None:
    """Serve `settings.generator.models` until SIGINT or SIGTERM."""
    static = ModelRegistry.from_files(settings.models_file)
    for name in settings.generator.models:
        if name != "*":
            static.resolve(name)
    _run(_serve(settings, static))


async def _serve(settings: Settings, static: ModelRegistry) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bus = await _connect(settings)
    try:
        registry = LiveRegistry(static, await bus.key_value(settings.nats.registry_bucket))
        await registry.start()
        await GenerationWorker(settings, bus, registry).run(stop)
    finally:
        await bus.close()
