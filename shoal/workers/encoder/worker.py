"""The encoder worker: embeddings, NER, multi-vector, rerank and classify jobs, batched by
token cost and run on one forward thread.

Delivery (pulling, admission, keepalives, cancels, settling, stopping) is the worker
core's (shoal/workers/core/). This kind adds, on the same event loop:

- room, what runs next and at what size: the rules are a pure policy (schedule.py), which
  this kind tells what happened and asks what to do;
- admitted jobs are tokenized on the tokenizer thread into the model's batchers, one
  per (op, LoRA adapter, lane); jobs for a model that is not resident wait while it
  loads (`Loader`, on a loader thread, so serving the resident models goes on), and
  models are evicted least recently used to stay within the memory budget;
- one scheduler task owns the batchers: when the policy names a batch it takes it, runs
  it on a forward thread (forward.py: a failing input is isolated from its batch mates),
  scatters the rows back to their jobs and answers each job that is complete. A pass runs
  alone on all threads, or under load two side by side on a CPU engine made for it
  (passes.py says when), each on a thread of its own.

What can go wrong, by the core's outcomes: an input the model cannot take (too long
with `truncate: false`, bad token ids) is INVALID; an unknown LoRA adapter NOT_FOUND; a
model that cannot load or fit UNAVAILABLE; a forward pass that fails on a job's own
inputs FAILED (retried, a dead letter on its last delivery); post-processing INTERNAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import torch

from ... import telemetry
from ...config import Settings
from ...model_registry import LiveRegistry, ModelSpec, SourceResolver
from ...queue import Bus, Delivery
from ...queue.messages import Job
from ...queue.payloads import PayloadStore
from ..adapters import EncoderAdapter, make_adapter
from ..adapters.sentence_transformers import pick_device
from ..batcher import Batcher
from ..core import Core, Held, Outcome, Worker, WorkerKind
from ..observe import WorkerMetrics
from ..tokens import answer_asked
from .forward import forward_isolating, prepare, too_long
from .held import EncoderHeld, Unit, jobs_of
from .loader import Loader, LoadError
from .model import EncoderModel
from .passes import Pass
from .residency import Residency, available_memory
from .results import build_result
from .schedule import EncoderSchedule, Run
from .spans import note_forward, record_spans

__all__ = ["EncoderKind", "EncoderWorker"]

log = logging.getLogger(__name__)


class EncoderWorker(Worker):
    """A worker core running the encoder kind (what `shoal worker` runs)."""

    def __init__(
        self,
        settings: Settings,
        bus: Bus,
        registry: LiveRegistry,
        adapters: Sequence[EncoderAdapter] = (),
        worker_id: str | None = None,
        payloads: PayloadStore | None = None,
    ) -> None:
        """`adapters` preset the adapter of some models (tests use the dummy one); the
        others are made from their spec's runtime."""
        super().__init__(
            settings, bus, registry, EncoderKind(settings, adapters), worker_id, payloads
        )


class EncoderKind(WorkerKind):
    """Encoder models, their batchers, the tokenizer and forward threads, residency."""

    name = "enc"

    def __init__(self, settings: Settings, adapters: Sequence[EncoderAdapter] = ()) -> None:
        self.settings = settings
        self._preset = {a.spec.id: a for a in adapters}
        self.models: dict[str, EncoderModel] = {}
        self._clock = time.monotonic
        self._wake = asyncio.Event()
        self._loading: set[asyncio.Task] = set()
        self._scheduler: asyncio.Task | None = None
        # The forward thread runs every pass alone, the first of two side by side, and the
        # loader's work (loads, unloads, LoRA swaps: never during a pass on it); the second
        # runs only a pass beside another, on the base model in an engine stream.
        self._forward_pool = ThreadPoolExecutor(1, thread_name_prefix="shoal-forward")
        self._beside_pool = ThreadPoolExecutor(1, thread_name_prefix="shoal-forward-beside")
        self._on_forward_thread: asyncio.Task | None = None
        self._passes: set[asyncio.Task] = set()
        """Every pass task until it ends (the loop keeps only weak references to tasks)."""
        self._tokenize = ThreadPoolExecutor(1, thread_name_prefix="shoal-tokenize")
        full_threads = torch.get_num_threads()
        w = settings.worker
        self.schedule = EncoderSchedule(
            self.models,
            self._clock,
            full_threads=full_threads,
            pairs=pick_device(w.device) == "cpu" and full_threads >= 2,
            max_held_jobs=w.max_held_jobs,
            batch_slice_ms=w.batch_slice_ms,
        )
        budget = w.memory_budget or int(0.7 * available_memory(pick_device(w.device)))
        self.residency = Residency(budget, w.pinned, self._clock)
        r = self.residency
        self.metrics = WorkerMetrics("encoder", lambda: (r.used, r.loads, r.evictions))
        self.batches_run = 0

    def attach(self, core: Core) -> None:
        super().attach(core)
        self.loader = Loader(
            self.residency,
            SourceResolver.of(self.settings),
            core.registry,
            self._forward_pool,
            on_change=self._signal,
        )

    # The models ------------------------------------------------------------------------

    def serves(self, spec: ModelSpec) -> bool:
        return self.settings.worker.serves(spec.id, spec.tasks)

    async def add_model(self, spec: ModelSpec) -> None:
        w = self.settings.worker
        adapter = self._preset.get(spec.id) or make_adapter(
            spec, w.device, w.max_adapters_per_model, self.settings.cache_path
        )
        self.models[spec.id] = EncoderModel(spec, adapter, self._clock)

    async def update_model(self, old: ModelSpec, new: ModelSpec) -> bool:
        """A changed batching profile applies to the running model; anything else not."""
        if msgspec.structs.replace(new, profile=old.profile) != old:
            return False
        model = self.models[new.id]
        model.use_profile(new)
        log.info("profile of %s now %r", new.id, new.profile)
        restart_knobs = (new.profile.dtype, new.profile.engine)
        if restart_knobs != (old.profile.dtype, old.profile.engine) and model.state in (
            "loading",
            "resident",
        ):
            log.info(
                "dtype %s and engine %s of %s take effect when the model is next loaded",
                new.profile.dtype,
                new.profile.engine,
                new.id,
            )
        self._signal()
        return True

    async def remove_model(self, model: str) -> None:
        await self.loader.evict(self.models.pop(model))

    async def registry_changed(self) -> None:
        for model in self.models.values():
            if model.state == "resident":
                await self.loader.forget_removed_loras(model)

    async def start(self) -> None:
        # Scheduling first: each pinned model serves what waited for it as soon as it is
        # resident, while the next one loads (a restart under load answers sooner).
        self._scheduler = asyncio.create_task(self._schedule())
        for model in list(self.models.values()):
            if model.spec.id in self.residency.pinned:
                await self._make_resident(model)

    async def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel()
        for task in self._passes:
            task.cancel()
        for task in self._loading:
            task.cancel()
        self._forward_pool.shutdown(wait=False, cancel_futures=True)
        self._beside_pool.shutdown(wait=False, cancel_futures=True)
        self._tokenize.shutdown(wait=False, cancel_futures=True)
        self.loader.close()

    def can_finish(self) -> bool:
        return any(m.state == "resident" for m in self.models.values())

    def ready_models(self) -> list[str]:
        return list(self.models)

    def heartbeat(self) -> dict[str, Any]:
        r = self.residency
        return {
            "models": sorted(set(self.settings.worker.models)),
            "resident": sorted(r.resident),
            "resident_bytes": r.used,
            "memory_budget": r.budget,
            "loads": r.loads,
            "evictions": r.evictions,
            "engines": {
                m.spec.id: m.adapter.engine() for m in self.models.values() if m.state == "resident"
            },
            "forward_busy": self.schedule.passes.busy,
            "passes_side_by_side": self.schedule.passes.side_by_side,
            **self.metrics.rates(),
        }

    # Room and admission ------------------------------------------------------------------

    def room(self, model: str, batch_lane: bool) -> int:
        held = self.core.held
        # Counted only where the policy reads it: room is asked at every pull.
        held_batch_lane = sum(1 for h in held.values() if h.batch_lane) if batch_lane else 0
        return self.schedule.room(model, batch_lane, len(held), held_batch_lane)

    def hold(self, delivery: Delivery, job: Job, batch_lane: bool) -> Held:
        return EncoderHeld(delivery, job, batch_lane)

    async def accept(self, model: str, jobs: list[Held], batch_lane: bool) -> None:
        if not batch_lane:
            self.schedule.live_arrived()
        served = self.models[model]
        fresh: list[EncoderHeld] = jobs  # type: ignore[assignment]
        if served.state != "resident":
            served.waiting.extend(fresh)
            if served.state in ("unloaded", "failed"):
                task = asyncio.create_task(self._make_resident(served))
                self._loading.add(task)
                task.add_done_callback(self._loading.discard)
            return
        await self._queue(served, fresh)

    def drop(self, jobs: list[Held]) -> None:
        for model in self.models.values():  # their queued inputs free room for other work
            model.waiting = [h for h in model.waiting if not h.done]
            for batcher in model.batchers.values():
                batcher.drop(lambda u: not u.held.done)
        self._signal()

    async def _queue(self, model: EncoderModel, jobs: list[EncoderHeld]) -> None:
        """Tokenize jobs for a resident model into its batchers."""
        loop = asyncio.get_running_loop()
        jobs = await answer_asked(self.core, jobs, model.tokens)  # type: ignore[arg-type]
        prepared = await loop.run_in_executor(self._tokenize, prepare, model.adapter, jobs)
        for held, tokens in zip(jobs, prepared, strict=True):
            if held.done:
                continue
            if isinstance(tokens, str):
                await self.core.settle(held, Outcome.INVALID, tokens)
                continue
            if not getattr(held.job, "truncate", True):
                over = next((i for i, t in enumerate(tokens) if t.truncated), None)
                if over is not None:
                    message = too_long(held, over, tokens[over], model.adapter.max_length)
                    await self.core.settle(held, Outcome.INVALID, message)
                    continue
            units = held.start(tokens)
            if units:
                model.batcher(held.op, held.job.adapter, held.batch_lane).add(units)
            else:
                await self._answer(held, model)
        self._wake.set()

    async def _make_resident(self, model: EncoderModel) -> None:
        try:
            await self.loader.ensure_resident(model, self.models.values())
        except LoadError as exc:
            waiting, model.waiting = model.waiting, []
            for held in waiting:
                await self.core.settle(held, Outcome.UNAVAILABLE, str(exc))
            return
        waiting, model.waiting = model.waiting, []
        await self._queue(model, [h for h in waiting if not h.done])

    # Batching and running ----------------------------------------------------------------

    async def _schedule(self) -> None:
        while True:
            self._wake.clear()
            run = self.schedule.next()
            if not isinstance(run, Run):  # nothing due before `run` (None: an event)
                timeout = None if run is None else max(0.0, run - self._clock())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            model = run.model
            batcher = model.batchers[run.key]
            await self._drop_expired(batcher)
            batch = [u for u in batcher.take(run.share) if not u.held.done]
            if not batch:
                self.core.signal_room()  # the inputs taken were queued room too
                continue
            # Counted running before any await: the loader must not evict it meanwhile.
            model.running += 1
            self.residency.touch(model.spec.id)
            on_forward_thread = self._on_forward_thread is None
            pool = self._forward_pool if on_forward_thread else self._beside_pool
            task = asyncio.create_task(self._run_batch(run, batch, pool))
            if on_forward_thread:
                self._on_forward_thread = task
            self._passes.add(task)
            self.schedule.started(task, run, _padded_tokens(batch))
            task.add_done_callback(functools.partial(self._pass_ended, model, batch, run.mode))
            self._arm_pulls()

    def _arm_pulls(self) -> None:
        """Let pulls go on when the policy says: at once, or as the passes running are
        about to end."""
        delay = self.schedule.pull_delay()
        if delay == 0.0:
            self.core.signal_room()
        elif delay is not None:
            asyncio.get_running_loop().call_later(delay, self.core.signal_room)

    def _forward_over(self, task: asyncio.Task | None, mode: Pass) -> None:
        if self._on_forward_thread is task:
            self._on_forward_thread = None
        if self.schedule.computed(task, mode):  # the other pass's horizon now decides
            self._arm_pulls()

    def _pass_ended(
        self, model: EncoderModel, batch: list[Unit], mode: Pass, task: asyncio.Task
    ) -> None:
        self._passes.discard(task)
        self._forward_over(task, mode)  # if it ended before its forward (a LoRA failed)
        self.schedule.ended(mode)
        model.running -= 1
        self.loader.notify_idle()
        self._signal()
        if task.cancelled() or task.exception() is None:
            return
        # Not the model's inputs (those fail in `_fail_inputs`): answering them failed.
        log.error("a forward pass failed outside its batch", exc_info=task.exception())
        unanswered = [held for held in jobs_of(batch) if not held.done]
        if unanswered:
            settling = asyncio.create_task(self._settle_all(unanswered, Outcome.INTERNAL))
            self._passes.add(settling)
            settling.add_done_callback(self._passes.discard)

    async def _settle_all(self, jobs: list[EncoderHeld], outcome: Outcome) -> None:
        for held in jobs:
            await self.core.settle(held, outcome, "answering failed")

    async def _run_batch(self, run: Run, batch: list[Unit], pool: ThreadPoolExecutor) -> None:
        """One pass over `batch` on `pool`'s thread, its outputs scattered and answered
        (`model.running` counts it from the scheduler until `_pass_ended`)."""
        model, key, mode = run.model, run.key, run.mode
        if key.lora and not await self._ensure_lora(model, key.lora, batch):
            return
        loop = asyncio.get_running_loop()
        toks = [u.tok for u in batch]
        padded = _padded_tokens(batch)
        started, wall_started = self._clock(), time.time()
        beside = mode is Pass.BESIDE
        try:
            outputs, errors = await loop.run_in_executor(
                pool,
                forward_isolating,
                *(model.adapter, key.op, key.lora, toks, run.threads, beside),
            )
        finally:
            self._forward_over(asyncio.current_task(), mode)
            self.core.signal_room()
        seconds = self._clock() - started
        fill = padded / max(1, model.spec.profile.max_batch_tokens)
        self.metrics.batch(model.spec.id, key.op, len(batch), padded, seconds, fill)
        if telemetry.tracing():
            note_forward(batch, wall_started, wall_started + seconds, padded)
        if errors:
            await self._fail_inputs(model, batch, errors)
        else:
            # The model's cost per token is a pass's alone (a pass beside another
            # takes about twice as long on half the threads).
            model.note_forward(seconds / 2 if beside else seconds, padded)
        if beside and model.state == "resident":  # its first pass compiled the engine's
            # two-stream copy: counted now
            self.residency.resized(model.spec.id, model.adapter.memory_bytes())
        self.batches_run += 1
        for unit, output in zip(batch, outputs, strict=True):
            held = unit.held
            if output is not None and not held.done and held.fill(unit.row, output):
                await self._answer(held, model)

    async def _ensure_lora(self, model: EncoderModel, lora: str, batch: list[Unit]) -> bool:
        try:
            await self.loader.ensure_lora(model, lora)
            return True
        except LoadError as exc:
            outcome = Outcome.NOT_FOUND if exc.not_found else Outcome.UNAVAILABLE
            for held in jobs_of(batch):
                await self.core.settle(held, outcome, str(exc))
            return False

    async def _fail_inputs(
        self, model: EncoderModel, batch: list[Unit], errors: dict[int, str]
    ) -> None:
        """Only the jobs whose own inputs failed retry; their batch mates are answered."""
        failed: dict[int, tuple[EncoderHeld, str]] = {}
        for i, error in errors.items():
            failed.setdefault(id(batch[i].held), (batch[i].held, error))
        log.error(
            "forward pass failed for %s on %d of %d inputs (%d jobs): %s",
            model.spec.id,
            len(errors),
            len(batch),
            len(failed),
            next(iter(errors.values())),
        )
        for held, error in failed.values():
            await self.core.settle(held, Outcome.FAILED, error)

    async def _drop_expired(self, batcher: Batcher[Unit]) -> None:
        now = time.time()
        dropped = batcher.drop(lambda u: not u.held.done and u.held.job.deadline > now)
        for held in jobs_of(dropped):
            if not held.done:
                message = "the request's deadline passed before it ran"
                await self.core.settle(held, Outcome.EXPIRED, message)

    async def _answer(self, held: EncoderHeld, model: EncoderModel) -> None:
        try:
            result = build_result(held, model.adapter)
        except Exception:
            log.exception("post-processing failed for %s", held.request_id)
            await self.core.settle(held, Outcome.INTERNAL, "post-processing failed")
            return
        publish_started = time.time()
        if await self.core.answer(held, result) and held.trace is not None:
            record_spans(held, model.spec.id, publish_started, time.time())

    def _signal(self) -> None:
        self._wake.set()
        self.core.signal_room()


def _padded_tokens(batch: list[Unit]) -> int:
    """Tokens a pass over `batch` computes: every row padded to the longest."""
    return len(batch) * max(u.cost for u in batch)
