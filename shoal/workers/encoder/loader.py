"""Loading and evicting models, and loading their LoRA adapters, inside one worker.

Weights are fetched (S3 into the local cache) and loaded on a loader thread, so the
forward thread keeps serving the resident models meanwhile; only the warm-up pass and
adapter injection, which touch a model the forward thread may run, go on the forward
thread. Before a load the `Residency` plan says what to evict; when the only evictable
models are busy, the load waits until one is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from ...model_registry import LiveRegistry, SourceResolver, UnknownAdapterError
from .model import EncoderModel
from .residency import ModelTooLargeError, Residency, weight_bytes

__all__ = ["LoadError", "Loader"]

log = logging.getLogger(__name__)

RETRY_FAILED_AFTER = 10.0
"""Seconds a model that failed to load answers with that failure before a retry."""


class LoadError(Exception):
    """A model or adapter cannot be fetched, loaded or fit."""

    def __init__(self, message: str, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found


class Loader:
    """Loads and evicts an encoder worker's models and their LoRA adapters."""

    def __init__(
        self,
        residency: Residency,
        resolver: SourceResolver,
        registry: LiveRegistry,
        forward: ThreadPoolExecutor,
        on_change: Callable[[], None],
    ) -> None:
        self.residency = residency
        self._resolver = resolver
        self._registry = registry
        self._forward_pool = forward
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="shoal-load")
        self._on_change = on_change
        self._locks: dict[str, asyncio.Lock] = {}
        self._idle = asyncio.Event()
        self._paths: dict[tuple[str, bool], str] = {}
        self._failed_at: dict[str, float] = {}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def notify_idle(self) -> None:
        """A batch finished: a busy model may have become evictable."""
        self._idle.set()

    async def _run(self, pool: ThreadPoolExecutor, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    async def _local(self, source: str, registered: bool) -> str:
        """`registered`: a run-time registration's source, held to its rules here too
        (the gateway checked it, but a link may have changed since, or an older gateway
        registered it)."""
        path = self._paths.get((source, registered))
        if path is None:
            fetch = partial(self._resolver.local, source, registered=registered)
            path = self._paths[(source, registered)] = await self._run(self._pool, fetch)
        return path

    async def ensure_resident(self, served: EncoderModel, models: Iterable[EncoderModel]) -> None:
        """Load `served`, evicting others as its memory needs.

        Raises:
            LoadError: it cannot be fetched, loaded, or fit in the budget.
        """
        lock = self._locks.setdefault(served.id, asyncio.Lock())
        async with lock:
            if served.state == "resident":
                return
            if served.state == "failed":
                if time.monotonic() - self._failed_at.get(served.id, 0) < RETRY_FAILED_AFTER:
                    raise LoadError(served.error)
                served.state = "unloaded"
            served.state = "loading"
            try:
                await self._load(served, {other.id: other for other in models})
            except Exception as exc:
                served.state = "failed"
                served.error = (
                    str(exc)
                    if isinstance(exc, LoadError)
                    else (f"model '{served.id}' failed to load: {exc}")
                )
                self._failed_at[served.id] = time.monotonic()
                log.error("%s", served.error)
                raise LoadError(served.error) from exc
            finally:
                self._on_change()

    async def _load(self, served: EncoderModel, models: dict[str, EncoderModel]) -> None:
        # The dummy runtime has no weights to fetch.
        registered = not self._registry.is_builtin(served.id)
        path = (
            ""
            if served.spec.runtime == "dummy"
            else await self._local(served.spec.source, registered)
        )
        weights = await self._run(self._pool, weight_bytes, path) if path else 0
        need = served.adapter.planned_bytes(weights)
        while True:
            busy = {m for m, other in models.items() if other is not served and other.busy}
            try:
                evict = self.residency.plan(served.id, need, busy)
            except ModelTooLargeError as exc:
                raise LoadError(str(exc)) from None
            if evict is not None:
                break
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), 1.0)
        # All marked first: only resident models run passes, and a pass started on one of
        # them while another unloads could run beside its own unload.
        doomed = [models[model] for model in evict if models[model].state == "resident"]
        for model in doomed:
            model.state = "unloaded"
        for model in doomed:
            await self._unload(model)
        started = time.monotonic()
        await self._run(self._pool, served.adapter.load, path)
        await self._run(self._forward_pool, served.adapter.warmup)
        size = served.adapter.memory_bytes() or need
        self.residency.loaded(served.id, size)
        served.state = "resident"
        log.info(
            "loaded %s (%.0f MiB) in %.1fs", served.id, size / 2**20, time.monotonic() - started
        )

    async def evict(self, served: EncoderModel) -> None:
        """Unload `served` if resident."""
        if served.state != "resident":
            return
        served.state = "unloaded"
        await self._unload(served)

    async def _unload(self, served: EncoderModel) -> None:
        def unload() -> None:
            served.adapter.unload()
            gc.collect()

        await self._run(self._forward_pool, unload)
        self.residency.evicted(served.id)
        log.info("evicted %s", served.id)
        self._on_change()

    async def ensure_lora(self, served: EncoderModel, name: str) -> None:
        """Have LoRA adapter `name` loaded on `served`'s resident model.

        Raises:
            LoadError: unknown adapter (`not_found`), or it cannot be fetched or loaded.
        """
        try:
            spec = self._registry.resolve_adapter(served.id, name)
        except UnknownAdapterError:
            raise LoadError(
                f"model '{served.id}' has no adapter '{name}'", not_found=True
            ) from None
        slots = served.adapter.lora
        if slots is None:
            raise LoadError(f"model '{served.id}' cannot take LoRA adapters")
        try:
            path = await self._local(spec.source, registered=True)  # adapters are registered
            await self._run(self._forward_pool, slots.ensure, name, path)
        except Exception as exc:
            raise LoadError(f"adapter '{served.id}:{name}' failed to load: {exc}") from exc

    async def forget_removed_loras(self, served: EncoderModel) -> None:
        slots = served.adapter.lora
        if slots is None:
            return
        known = {a.name for a in self._registry.adapters(served.id)}
        for name in slots.loaded():
            if name not in known:
                await self._run(self._forward_pool, slots.drop, name)
