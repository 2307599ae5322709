"""The worker core's served models, following the registry: a model registered (or
changed, or removed) at run time is served (or served anew, or dropped) by every worker
whose kind serves it, without a restart."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from ...config import Settings
from ...model_registry import LiveRegistry, ModelSpec
from ...queue import Bus, Subjects
from ...queue.provision import ensure_consumer
from .held import Held
from .kind import WorkerKind
from .outcomes import Outcome
from .served import Served, close_sources

__all__ = ["follow", "reconcile"]

log = logging.getLogger(__name__)

_RETRY_S, _RETRY_MAX_S = 1.0, 30.0
"""A failed follow of the registry is tried again after 1 s, doubling up to 30 s."""


class _Worker(Protocol):
    """What following the registry uses of worker.py's `Worker` (kind.py's `Core` is what a
    kind uses of it)."""

    settings: Settings
    bus: Bus
    subjects: Subjects
    registry: LiveRegistry
    kind: WorkerKind
    models: dict[str, Served]
    held: dict[int, Held]

    async def settle(self, held: Held, outcome: Outcome, message: str = "") -> None: ...

    async def pull(self, served: Served, batch_lane: bool) -> None: ...


async def follow(core: _Worker, changed: asyncio.Event) -> None:
    """Reconcile at each `changed`. What failed (a JetStream call timed out on a
    busy machine, a model that would not load) is logged and tried again after
    `_RETRY_S`, twice as long each time up to `_RETRY_MAX_S`: before, one failure
    ended this task, and the worker served no model registered after it."""
    retry = 0.0
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), retry or None)
        changed.clear()
        failed = await reconcile(core)
        retry = min(_RETRY_MAX_S, 2 * retry or _RETRY_S) if failed else 0.0
        for model, exc in failed.items():
            log.error("%s: could not follow the registry (%r); again in %.0f s", model, exc, retry)


async def reconcile(core: _Worker) -> dict[str, Exception]:
    """Serve every registry model the kind serves; drop removed ones; apply changed
    specs live where the kind can, else serve them anew. Returns what failed, by model;
    one model's failure stops none of the others."""
    wanted = {spec.id: spec for spec in core.registry if core.kind.serves(spec)}
    failed: dict[str, Exception] = {}
    for model, served in list(core.models.items()):
        spec = wanted.get(model)
        if spec == served.spec:
            continue
        try:
            if spec is not None and await core.kind.update_model(served.spec, spec):
                served.spec = spec
                continue
            await _remove(core, served)
        except Exception as exc:
            failed[model] = exc
    for model, spec in wanted.items():
        if model not in core.models and model not in failed:
            try:
                await _add(core, spec)
            except Exception as exc:
                failed[model] = exc
    try:
        await core.kind.registry_changed()
    except Exception as exc:
        failed["*"] = exc
    return failed


async def _add(core: _Worker, spec: ModelSpec) -> None:
    await core.kind.add_model(spec)
    nats = core.settings.nats
    sources = []
    try:
        for lane in ("interactive", "batch"):
            consumer = await ensure_consumer(core.bus, nats, core.subjects, lane, spec.id)
            sources.append(await core.bus.puller(nats.stream, consumer))
    except BaseException:
        # Not served after all: its lanes closed and the kind lets the model go, so a
        # retry adds it afresh.
        await close_sources(*sources)
        await core.kind.remove_model(spec.id)
        raise
    served = Served(spec, *sources)
    core.models[spec.id] = served
    served.pulls = [
        asyncio.create_task(core.pull(served, batch_lane=False)),
        asyncio.create_task(core.pull(served, batch_lane=True)),
    ]


async def _remove(core: _Worker, served: Served) -> None:
    model = served.spec.id
    del core.models[model]
    for task in served.pulls:
        task.cancel()
    await asyncio.gather(*served.pulls, return_exceptions=True)
    for held in [h for h in core.held.values() if h.job.model == model]:
        await core.settle(held, Outcome.RETURNED)
    await close_sources(served.source, served.batch_source)
    await core.kind.remove_model(model)
    log.info("stopped serving %s", model)
