"""The encoder worker: embeddings, NER, multi-vector, rerank and classify jobs, batched by
token cost and run on one forward thread.

Delivery (pulling, admission, keepalives, cancels, settling, stopping) is the worker
core's (shoal/workers/core/). This kind adds, on the same event loop:

- room: live work is pulled while the worker holds fewer than `max_held_jobs` items, the
  model has less than about four batches of live inputs queued, and the forward pass
  running (if any) is expected to end within `_PULL_HORIZON`; batch-lane work only while
  no live work is pending, a few items at a time;
- admitted jobs are tokenized on the tokenizer thread into the model's batchers, one
  per (op, LoRA adapter, lane); jobs for a model that is not resident wait while it
  loads (`Loader`, on a loader thread, so serving the resident models goes on), and
  models are evicted least recently used to stay within the memory budget;
- one scheduler task owns the batchers: when one is ready it takes a batch, runs it on
  a forward thread (forward.py: a failing input is isolated from its batch mates),
  scatters the rows back to their jobs and answers each job that is complete. Batch-lane
  batches run only when no live work is pending, cut to a short slice of the forward
  time while live traffic is about. A pass runs alone on all threads, or under load two
  run side by side on a CPU engine made for it (passes.py says when).

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
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import torch

from .. import telemetry
from ..config import Settings
from ..model_registry import LiveRegistry, ModelSpec, SourceResolver
from ..queue import Bus, Delivery
from ..queue.messages import Job
from ..queue.payloads import PayloadStore
from .adapters import EncoderAdapter, make_adapter
from .adapters.sentence_transformers import pick_device
from .batcher import Batcher
from .core import Held, Outcome, Worker, WorkerKind
from .encoder_model import BatcherKey, EncoderModel
from .forward import forward_isolating, prepare, too_long
from .held import HeldJob, Unit
from .loader import Loader, LoadError
from .observe import WorkerMetrics, record_job_spans
from .passes import Pass, PassPlanner
from .residency import Residency, available_memory
from .results import build_result

__all__ = ["EncoderKind", "EncoderWorker"]

log = logging.getLogger(__name__)

_POOL_BATCHES = 4
"""Live inputs queued per model, in batches: enough for the batcher to group by length."""
_PULL_HORIZON = 0.005
"""Seconds before its forward pass is expected to end from which a busy worker pulls live
work again. A pull waiting on a busy worker takes the next request from the shared queue
even while another worker is idle, and the request waits behind the whole pass: with
Shoal's pull on 4 to 32 workers, that kept the knee at the push round-robin router's
(perf/scale/README.md). Pulling only when about to be free sends work to whoever can
start it first (a fetch takes well under this horizon on a local nats-server)."""
_LIVE_TRAFFIC_HORIZON = 2.0
"""Seconds after a live arrival during which batch-lane work yields to it."""
_IDLE_SLICES = 10
"""With no live traffic about, a batch-lane forward may take this many slices: it bounds
what the first live request to arrive waits for (on a CPU, batches past a few inputs
hardly gain throughput; on a GPU, ten slices are a large batch)."""
_BATCH_LANE_LIVE_FETCH = 2
"""Batch-lane items pulled at a time while live traffic is about (each is tokenized on
the thread live work is tokenized on)."""


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
        self._served = set(settings.worker.models)
        self.models: dict[str, EncoderModel] = {}
        self._clock = time.monotonic
        self._last_live = -1e9
        self._wake = asyncio.Event()
        self._loading: set[asyncio.Task] = set()
        self._scheduler: asyncio.Task | None = None
        # The forward thread runs every pass alone, the first of two side by side, and the
        # loader's work (loads, unloads, LoRA swaps: never during a pass on it); the second
        # runs only a pass beside another, on the base model in an engine stream.
        self._forward = ThreadPoolExecutor(1, thread_name_prefix="shoal-forward")
        self._beside = ThreadPoolExecutor(1, thread_name_prefix="shoal-forward-beside")
        self._on_forward_thread: asyncio.Task | None = None
        self._passes: set[asyncio.Task] = set()
        """Every pass task until it ends (the loop keeps only weak references to tasks)."""
        self._tokenize = ThreadPoolExecutor(1, thread_name_prefix="shoal-tokenize")
        self._full_threads = torch.get_num_threads()
        w = settings.worker
        cpu = pick_device(w.device) == "cpu"
        self.passes = PassPlanner(self._clock, pairs=cpu and self._full_threads >= 2)
        self._running: dict[asyncio.Task, float] = {}
        """The forward passes running, each with when it is expected to end (clock time).
        A pass leaves it when its forward ends (pulls go on), and leaves the planner once
        its answers are sent (so the next pass is chosen once the pulls that this let in
        had their time, as live work must not find a batch-lane pass just started)."""
        budget = w.memory_budget or int(0.7 * available_memory(pick_device(w.device)))
        self.residency = Residency(budget, w.pinned, self._clock)
        r = self.residency
        self.metrics = WorkerMetrics("encoder", lambda: (r.used, r.loads, r.evictions))
        self.batches_run = 0

    def attach(self, core: Worker) -> None:
        super().attach(core)
        self.loader = Loader(
            self.residency,
            SourceResolver.of(self.settings),
            core.registry,
            self._forward,
            on_change=self._signal,
        )

    # The models ------------------------------------------------------------------------

    def serves(self, spec: ModelSpec) -> bool:
        if "generate" in spec.tasks:  # generation workers serve these
            return False
        return "*" in self._served or spec.id in self._served

    async def add_model(self, spec: ModelSpec) -> None:
        w = self.settings.worker
        adapter = self._preset.get(spec.id) or make_adapter(
            spec, w.device, w.max_adapters_per_model
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
        for model in list(self.models.values()):
            if model.spec.id in self.residency.pinned:
                await self._make_resident(model)
        self._scheduler = asyncio.create_task(self._schedule())

    async def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel()
        for task in self._passes:
            task.cancel()
        for task in self._loading:
            task.cancel()
        self._forward.shutdown(wait=False, cancel_futures=True)
        self._beside.shutdown(wait=False, cancel_futures=True)
        self._tokenize.shutdown(wait=False, cancel_futures=True)
        self.loader.close()

    def can_finish(self) -> bool:
        return any(m.state == "resident" for m in self.models.values())

    def ready_models(self) -> list[str]:
        return list(self.models)

    def heartbeat(self) -> dict[str, Any]:
        r = self.residency
        return {
            "models": sorted(self._served),
            "resident": sorted(r.resident),
            "resident_bytes": r.used,
            "memory_budget": r.budget,
            "loads": r.loads,
            "evictions": r.evictions,
            "engines": {
                m.spec.id: m.adapter.engine() for m in self.models.values() if m.state == "resident"
            },
            "forward_busy": self.passes.busy,
            "passes_side_by_side": self.passes.side_by_side,
            **self.metrics.rates(),
        }

    # Room and admission ------------------------------------------------------------------

    def room(self, model: str, batch_lane: bool) -> int:
        served = self.models.get(model)
        if served is None:
            return 0
        max_held = self.settings.worker.max_held_jobs
        held = self.core.held
        if not batch_lane:
            # Only live work counts here: batch-lane work never keeps live work unpulled.
            queued_limit = _POOL_BATCHES * served.spec.profile.max_batch_items
            if served.interactive_queued >= queued_limit:
                return 0
            if self._about_to_be_busy():
                return 0
            return max(0, max_held - len(held))
        # Batch lane: none while any live work is pending on this worker, and never more
        # than half the held-job slots or about two batches of inputs, so live work
        # always finds room.
        if any(other.interactive_queued for other in self.models.values()):
            return 0
        live = self._live_traffic_about()
        if live and self._running:
            # Pulled now, it would be due when this pass ends, racing the live work that
            # the pull horizon lets in just before: pulled once the pass has ended instead.
            return 0
        if served.batch_queued() >= 2 * served.spec.profile.max_batch_items:
            return 0
        held_batch = sum(1 for h in held.values() if h.batch_lane)
        most = _BATCH_LANE_LIVE_FETCH if live else 16
        return max(0, min(max_held // 2 - held_batch, max_held - len(held), most))

    def hold(self, delivery: Delivery, job: Job, batch_lane: bool) -> Held:
        return HeldJob(delivery, job, batch_lane)

    async def accept(self, model: str, jobs: list[Held], batch_lane: bool) -> None:
        if not batch_lane:
            self._last_live = self._clock()
        served = self.models[model]
        fresh: list[HeldJob] = jobs  # type: ignore[assignment]
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

    async def _queue(self, model: EncoderModel, jobs: list[HeldJob]) -> None:
        """Tokenize jobs for a resident model into its batchers."""
        loop = asyncio.get_running_loop()
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
            due, wake_at = self._next_due()
            kind = None if due is None else self.passes.next(self._may_pair(*due))
            if kind is None:
                # Nothing due, or it waits for a running pass (whose end wakes this).
                if due is not None:
                    wake_at = None
                timeout = None if wake_at is None else max(0.0, wake_at - self._clock())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            model, key = due
            batcher = model.batchers[key]
            await self._drop_expired(batcher)
            threads = self._threads(model)
            share = 1.0
            if key.batch_lane:
                live = self._live_traffic_about()
                share = self._batch_slice_share(model, batcher, 1 if live else _IDLE_SLICES)
                if live:  # leave half the cores to the live path while it is busy
                    threads = max(1, threads // 2)
            elif kind is Pass.BESIDE:
                # On half the threads: half the tokens end it about when a full batch
                # alone would, so a request does not wait twice as long behind it.
                share = 0.5
            batch = [u for u in batcher.take(share) if not u.held.done]
            if not batch:
                self.core.signal_room()  # the inputs taken were queued room too
                continue
            self.passes.started(kind)
            # Counted running before any await: the loader must not evict it meanwhile.
            model.running += 1
            self.residency.touch(model.spec.id)
            on_forward_thread = self._on_forward_thread is None
            pool = self._forward if on_forward_thread else self._beside
            task = asyncio.create_task(self._run_batch(model, key, batch, threads, kind, pool))
            if on_forward_thread:
                self._on_forward_thread = task
            self._passes.add(task)
            self._running[task] = self._expected_end(model, batch, kind)
            task.add_done_callback(functools.partial(self._pass_ended, model, batch, kind))
            self._arm_pulls()

    def _may_pair(self, model: EncoderModel, key: BatcherKey) -> bool:
        """Whether the batch due may run beside another pass: live work, on an engine and
        op that allow it, with at least a thread per stream."""
        return (
            not key.batch_lane
            and self._threads(model) >= 2
            and model.adapter.runs_side_by_side(key.op, key.lora)
        )

    def _threads(self, model: EncoderModel) -> int:
        """The intra-op threads of `model`'s live passes (alone, or shared by two)."""
        return model.spec.profile.threads or self._full_threads

    def _expected_end(self, model: EncoderModel, batch: list[Unit], kind: Pass) -> float:
        """When a pass over `batch` should end, from the model's measured cost per token
        (a pass beside another takes about twice as long); until measured, never."""
        padded = _padded_tokens(batch)
        per_token = model.seconds_per_token or math.inf
        return self._clock() + per_token * padded * (2 if kind is Pass.BESIDE else 1)

    def _arm_pulls(self) -> None:
        """Let pulls go on once the passes running are about to end (or at once, where a
        pass could start beside them)."""
        if not self._about_to_be_busy():
            self.core.signal_room()
            return
        soonest = min(self._running.values())
        if soonest < math.inf:
            delay = soonest - _PULL_HORIZON - self._clock()
            asyncio.get_running_loop().call_later(max(0.0, delay), self.core.signal_room)

    def _forward_over(self, task: asyncio.Task | None, kind: Pass) -> None:
        if self._on_forward_thread is task:
            self._on_forward_thread = None
        if self._running.pop(task, None) is not None:  # type: ignore[arg-type]
            self.passes.computed(kind)
            if self._running:  # the other pass's horizon now decides
                self._arm_pulls()

    def _pass_ended(
        self, model: EncoderModel, batch: list[Unit], kind: Pass, task: asyncio.Task
    ) -> None:
        self._passes.discard(task)
        self._forward_over(task, kind)  # if it ended before its forward (a LoRA failed)
        self.passes.ended(kind)
        model.running -= 1
        self.loader.notify_idle()
        self._signal()
        if task.cancelled() or task.exception() is None:
            return
        # Not the model's inputs (those fail in `_fail_inputs`): answering them failed.
        log.error("a forward pass failed outside its batch", exc_info=task.exception())
        unanswered = [held for held in _jobs_of(batch) if not held.done]
        if unanswered:
            settling = asyncio.create_task(self._settle_all(unanswered, Outcome.INTERNAL))
            self._passes.add(settling)
            settling.add_done_callback(self._passes.discard)

    async def _settle_all(self, jobs: list[HeldJob], outcome: Outcome) -> None:
        for held in jobs:
            await self.core.settle(held, outcome, "answering failed")

    def _next_due(self) -> tuple[tuple[EncoderModel, BatcherKey] | None, float | None]:
        """The batch due soonest on a resident model, if due now; else when one will be.
        Batch-lane work runs only when no live work is pending at all: a batch job fills
        spare capacity and never makes a live request wait for its turn."""
        for batch_lane in (False, True):
            best: tuple[float, EncoderModel, BatcherKey] | None = None
            for model in self.models.values():
                if model.state != "resident":
                    continue
                for key, batcher in model.batchers.items():
                    if key.batch_lane != batch_lane:
                        continue
                    at = batcher.ready_at()
                    if at is not None and (best is None or at < best[0]):
                        best = (at, model, key)
            if best is None:
                continue
            if best[0] <= self._clock():
                return (best[1], best[2]), None
            return None, best[0]
        return None, None

    def _live_traffic_about(self) -> bool:
        return self._clock() - self._last_live < _LIVE_TRAFFIC_HORIZON

    def _batch_slice_share(self, model: EncoderModel, batcher: Batcher[Unit], slices: int) -> float:
        """The share of the token budget a batch-lane forward may take: as many tokens as
        the model runs in `slices` x `batch_slice_ms` (from its measured cost per token),
        so a live request that arrives during one waits for a short forward pass, not a
        full one. Until measured, one input at a time."""
        if model.seconds_per_token <= 0:
            return 0.0
        budget = slices * self.settings.worker.batch_slice_ms / 1000
        tokens = budget / model.seconds_per_token
        return min(1.0, tokens / batcher.profile.max_batch_tokens)

    async def _run_batch(
        self,
        model: EncoderModel,
        key: BatcherKey,
        batch: list[Unit],
        threads: int,
        kind: Pass,
        pool: ThreadPoolExecutor,
    ) -> None:
        """One pass over `batch` on `pool`'s thread, its outputs scattered and answered
        (`model.running` counts it from the scheduler until `_pass_ended`)."""
        if key.lora and not await self._ensure_lora(model, key.lora, batch):
            return
        loop = asyncio.get_running_loop()
        toks = [u.tok for u in batch]
        padded = _padded_tokens(batch)
        started, wall_started = self._clock(), time.time()
        beside = kind is Pass.BESIDE
        try:
            outputs, errors = await loop.run_in_executor(
                pool,
                forward_isolating,
                *(model.adapter, key.op, key.lora, toks, threads, beside),
            )
        finally:
            self._forward_over(asyncio.current_task(), kind)
            self.core.signal_room()
        seconds = self._clock() - started
        fill = padded / max(1, model.spec.profile.max_batch_tokens)
        self.metrics.batch(model.spec.id, key.op, len(batch), padded, seconds, fill)
        if telemetry.tracing():
            _note_forward(batch, wall_started, wall_started + seconds, padded)
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

    def _about_to_be_busy(self) -> bool:
        """Whether the forward passes running end beyond `_PULL_HORIZON` with no room for
        another beside them, or none runs and a live batch is due (its pass starts before a
        pull could bring more)."""
        if self._running:
            if self.passes.has_room():
                return False
            return min(self._running.values()) - self._clock() > _PULL_HORIZON
        due, _ = self._next_due()
        return due is not None and not due[1].batch_lane

    async def _ensure_lora(self, model: EncoderModel, lora: str, batch: list[Unit]) -> bool:
        try:
            await self.loader.ensure_lora(model, lora)
            return True
        except LoadError as exc:
            outcome = Outcome.NOT_FOUND if exc.not_found else Outcome.UNAVAILABLE
            for held in _jobs_of(batch):
                await self.core.settle(held, outcome, str(exc))
            return False

    async def _fail_inputs(
        self, model: EncoderModel, batch: list[Unit], errors: dict[int, str]
    ) -> None:
        """Only the jobs whose own inputs failed retry; their batch mates are answered."""
        failed: dict[int, tuple[HeldJob, str]] = {}
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
        for held in _jobs_of(dropped):
            if not held.done:
                message = "the request's deadline passed before it ran"
                await self.core.settle(held, Outcome.EXPIRED, message)

    async def _answer(self, held: HeldJob, model: EncoderModel) -> None:
        try:
            result = build_result(held, model.adapter)
        except Exception:
            log.exception("post-processing failed for %s", held.request_id)
            await self.core.settle(held, Outcome.INTERNAL, "post-processing failed")
            return
        publish_started = time.time()
        if await self.core.answer(held, result) and held.trace is not None:
            _record_spans(held, model.spec.id, publish_started, time.time())

    def _signal(self) -> None:
        self._wake.set()
        self.core.signal_room()


def _note_forward(batch: list[Unit], started: float, ended: float, tokens: int) -> None:
    """Keep each traced job's forward-pass times (its first batch's start, last's end)
    and the size of its last batch."""
    for held in _jobs_of(batch):
        if held.trace is not None:
            held.forward_started = held.forward_started or started
            held.forward_ended = ended
            held.batch_seen = (len(batch), tokens)


def _record_spans(held: HeldJob, model: str, publish_started: float, ended: float) -> None:
    assert held.trace is not None
    job = held.job
    attributes = {"shoal.model": model, "shoal.op": held.op, "shoal.request_id": job.request_id}
    forward = {
        "shoal.inputs": len(held.tokens),
        "shoal.tokens": held.prompt_tokens,
        "shoal.batch.size": held.batch_seen[0],
        "shoal.batch.tokens": held.batch_seen[1],
    }
    record_job_spans(
        held.trace,
        held.delivery.published_at,
        held.pulled_at,
        ended,
        attributes,
        [
            ("shoal.tokenize", held.pulled_at, held.queued_at, {}),
            ("shoal.batch.wait", held.queued_at, held.forward_started, {}),
            ("shoal.forward", held.forward_started, held.forward_ended, forward),
            ("shoal.result.publish", publish_started, ended, {}),
        ],
    )


def _padded_tokens(batch: list[Unit]) -> int:
    """Tokens a pass over `batch` computes: every row padded to the longest."""
    return len(batch) * max(u.cost for u in batch)


def _jobs_of(units: list[Unit]) -> list[HeldJob]:
    return list({id(u.held): u.held for u in units}.values())
