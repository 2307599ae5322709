"""`shoal worker --kind generate`: one generation worker process."""

from __future__ import annotations

from ...config import Settings
from ...model_registry import ModelRegistry
from ..main import run_loop, serve_worker
from .worker import GenerationWorker

__all__ = ["run_generation_worker"]


def run_generation_worker(settings: Settings) -> None:
    """Serve `settings.generator.models` until SIGINT or SIGTERM."""
    static = ModelRegistry.from_files(*settings.spec_files)
    for name in settings.generator.models:
        if name != "*":
            static.resolve(name)
    run_loop(serve_worker(settings, static, GenerationWorker, "generator"))
