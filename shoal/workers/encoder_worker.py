"""The encoder worker: pull work, batch it by token cost, run it, reply, ack.

Tasks, all on one event loop:

- one pull task per served model fetches items from that model's durable consumer while
  the worker has room (`max_held_jobs` items held, about four batches of inputs queued),
  decodes them and tokenizes them on the tokenizer thread into the model's batchers, one
  per (op, LoRA adapter); items for a model that is not resident wait while it loads;
- one scheduler task owns the batchers: when one is ready it takes a batch, runs it on
  the single forward thread, scatters the rows back to their jobs, and replies and acks
  each job that is complete;
- models load on their first item (`Loader`, on a loader thread, so serving the resident
  models goes on) and are evicted least recently used to stay within the memory budget;
- a reconcile task follows the shared registry: models registered at run time are served
  (when this worker serves `*`) and removed ones dropped, and changed batching profiles
  apply to the running lanes, without a restart;
- a keepalive task sends `in_progress` for items held a while, so a long queue inside the
  worker is not mistaken for a dead worker;
- a heartbeat task tells gateways what this worker serves and holds.

How each outcome settles its item:

| outcome                                   | reply                        | settle           |
|-------------------------------------------|------------------------------|------------------|
| answered                                  | result                       | ack           |
| undecodable item                          | failure, if its header reads | term          |
| offloaded item gone (request over)        | none                         | ack           |
| offloaded item, payload store unreadable  | none; failure on last try    | nak(2 s); term |
| reply too large and the store failed      | failure                      | term          |
| deadline passed before it ran             | failure                      | ack           |
| invalid input (too long, bad token ids)   | failure                      | term          |
| unknown adapter; model cannot load or fit | failure                      | term          |
| forward pass failed, deliveries left      | none                         | nak(1 s)      |
| forward pass failed, last delivery        | failure; dead letter         | term          |
| request cancelled (client left, deadline) | none                         | ack           |
| worker stopping with the item not run     | none                         | nak (at once) |
| worker killed                             | none                         | (after ack_wait) |
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import torch

from .. import telemetry
from ..config import Settings
from ..lifecycle import DRAIN_SECONDS
from ..model_registry import LiveRegistry, ModelSpec, SourceResolver
from ..queue import Bus, Delivery, ErrorKind, JobFailed, Subjects, WorkerHeartbeat
from ..queue.dead_letters import DeadLetters
from ..queue.errors import PayloadStoreError
from ..queue.messages import encode
from ..queue.payloads import PayloadStore, open_payload_store
from ..queue.provision import ensure_consumer, ensure_work_stream
from .adapters import EncoderAdapter, make_adapter
from .adapters.base import Tokenized
from .adapters.sentence_transformers import pick_device
from .batcher import Batcher
from .cancels import CancelledRequests
from .held import HeldJob, Unit
from .intake import read_job
from .lane import BatcherKey, Lane
from .loader import Loader, LoadError
from .observe import WorkerMetrics, record_job_spans
from .residency import Residency, available_memory
from .results import build_result

__all__ = ["EncoderWorker"]

log = logging.getLogger(__name__)

_POOL_BATCHES = 4
_LIVE_TRAFFIC_HORIZON = 2.0
"""Seconds after an interactive arrival during which batch-lane work yields to it."""
_IDLE_SLICES = 10
"""With no live traffic about, a batch-lane forward may take this many slices: it bounds
what the first live request to arrive waits for (on a CPU, batches past a few inputs
hardly gain throughput; on a GPU, ten slices are a large batch)."""
_BATCH_LANE_LIVE_FETCH = 2
"""Batch-lane items pulled at a time while live traffic is about (each is tokenized on
the thread live work is tokenized on)."""
_BATCH_LANE_POLL = 0.02
"""Seconds between looks for spare capacity to pull batch-lane work into."""


class EncoderWorker:
    def __init__(
        self,
        settings: Settings,
        bus: Bus,
        registry: LiveRegistry,
        adapters: Sequence[EncoderAdapter] = (),
        worker_id: str | None = None,
        payloads: PayloadStore | None = None,
    ) -> None:
        """`adapters` preset the adapter of some models (tests use the dummy one);
        the others are made from their spec's runtime. `payloads`: where items and
        replies too large for a message travel (default: from the settings)."""
        self.settings = settings
        self.bus = bus
        self.payloads = payloads or open_payload_store(settings, bus)
        self.registry = registry
        self.subjects = Subjects(settings.nats.subject_prefix)
        self.worker_id = worker_id or f"enc-{secrets.token_hex(4)}"
        self.dead_letters = DeadLetters(bus, settings.nats, self.subjects)
        self._clock = time.monotonic
        self._last_interactive = -1e9
        self._preset = {a.spec.id: a for a in adapters}
        self._served = set(settings.worker.models)
        self._lanes: dict[str, Lane] = {}
        self._held: dict[int, HeldJob] = {}
        self._state: str = "loading"
        self._stopping = False
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._changed = asyncio.Event()
        self._loading: set[asyncio.Task] = set()
        self._settling: set[asyncio.Task] = set()
        self._cancelled = CancelledRequests(settings.gateway.request_timeout + 60)
        self._forward = ThreadPoolExecutor(1, thread_name_prefix="shoal-forward")
        self._full_threads = torch.get_num_threads()
        self._tokenize = ThreadPoolExecutor(1, thread_name_prefix="shoal-tokenize")
        device = settings.worker.device
        budget = settings.worker.memory_budget or int(0.7 * available_memory(pick_device(device)))
        self.residency = Residency(budget, settings.worker.pinned, self._clock)
        self.loader = Loader(
            self.residency,
            SourceResolver(f"{settings.data_dir}/cache", settings.s3),
            registry,
            self._forward,
            on_change=self._signal,
        )
        self.batches_run = 0
        self.batch_sizes: list[int] = []
        r = self.residency
        self.metrics = WorkerMetrics("encoder", lambda: (r.used, r.loads, r.evictions))

    @property
    def state(self) -> str:
        """`loading`, `ready` or `stopping`, as its heartbeats say."""
        return self._state

    def serves(self, spec: ModelSpec) -> bool:
        if "generate" in spec.tasks:  # generation workers serve these
            return False
        return "*" in self._served or spec.id in self._served

    # Lifecycle -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then finish what is held and leave cleanly."""
        heartbeat = asyncio.create_task(self._heartbeat())
        tasks: list[asyncio.Task] = []
        try:
            await ensure_work_stream(self.bus, self.settings.nats, self.subjects)
            await self.bus.subscribe(self.subjects.cancel, self._on_cancel)
            await self._reconcile()
            await self._load_pinned()
            self._state = "ready"
            await self._send_heartbeat()
            log.info("worker %s ready: %s", self.worker_id, ", ".join(self._lanes))
            self.registry.add_listener(self._changed.set)
            tasks = [
                asyncio.create_task(self._schedule()),
                asyncio.create_task(self._keepalive()),
                asyncio.create_task(self._follow_registry()),
            ]
            await stop.wait()
            await self._shutdown(tasks)
        finally:
            heartbeat.cancel()
            self._state = "stopping"
            await self._send_heartbeat()
            self._forward.shutdown(wait=False, cancel_futures=True)
            self._tokenize.shutdown(wait=False, cancel_futures=True)
            self.loader.close()

    async def _load_pinned(self) -> None:
        for lane in list(self._lanes.values()):
            if lane.model in self.residency.pinned:
                await self._make_resident(lane)

    async def _shutdown(self, tasks: list[asyncio.Task]) -> None:
        self._stopping = True
        pullers = [
            task
            for lane in self._lanes.values()
            for task in (lane.pull_task, lane.batch_pull_task)
            if task is not None
        ]
        for task in pullers:
            task.cancel()
        await asyncio.gather(*pullers, return_exceptions=True)
        # What is held gets the drain time to finish; the rest goes back to the queue.
        deadline = self._clock() + min(self.settings.nats.ack_wait, DRAIN_SECONDS)
        while (
            self._held
            and self._clock() < deadline
            and any(lane.state == "resident" for lane in self._lanes.values())
        ):
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), 0.5)
        for task in tasks:
            task.cancel()
        for held in list(self._held.values()):
            await self._settle(held, "nak")
        for lane in self._lanes.values():
            for source in (lane.source, lane.batch_source):
                if source is not None:
                    await source.close()

    # Following the registry ----------------------------------------------------------

    async def _follow_registry(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            await self._reconcile()

    async def _reconcile(self) -> None:
        """Serve every registry model this worker should; drop removed or changed ones,
        except that a changed profile applies to the running lane."""
        wanted = {spec.id: spec for spec in self.registry if self.serves(spec)}
        for model, lane in list(self._lanes.items()):
            spec = wanted.get(model)
            if spec == lane.spec:
                continue
            if (
                spec is not None
                and msgspec.structs.replace(spec, profile=lane.spec.profile) == lane.spec
            ):
                self._use_profile(lane, spec)
            else:
                await self._drop_lane(lane)
        for model, spec in wanted.items():
            if model not in self._lanes:
                await self._add_lane(spec)
        for lane in self._lanes.values():
            if lane.state == "resident":
                await self.loader.forget_removed_loras(lane)

    def _use_profile(self, lane: Lane, spec: ModelSpec) -> None:
        old = lane.spec.profile
        lane.use_profile(spec)
        log.info("profile of %s now %r", lane.model, spec.profile)
        new = spec.profile
        if (new.dtype, new.engine) != (old.dtype, old.engine) and lane.state in (
            "loading",
            "resident",
        ):
            log.info(
                "dtype %s and engine %s of %s take effect when the model is next loaded",
                new.dtype,
                new.engine,
                lane.model,
            )
        self._signal()

    async def _add_lane(self, spec: ModelSpec) -> None:
        w = self.settings.worker
        adapter = self._preset.get(spec.id) or make_adapter(
            spec, w.device, w.max_adapters_per_model
        )
        lane = Lane(spec, adapter, self._clock)
        nats = self.settings.nats
        consumer = await ensure_consumer(self.bus, nats, self.subjects, "interactive", spec.id)
        lane.source = await self.bus.puller(nats.stream, consumer)
        batch_consumer = await ensure_consumer(self.bus, nats, self.subjects, "batch", spec.id)
        lane.batch_source = await self.bus.puller(nats.stream, batch_consumer)
        self._lanes[spec.id] = lane
        lane.pull_task = asyncio.create_task(self._pull(lane))
        lane.batch_pull_task = asyncio.create_task(self._pull_batch_lane(lane))

    async def _drop_lane(self, lane: Lane) -> None:
        del self._lanes[lane.model]
        pullers = [t for t in (lane.pull_task, lane.batch_pull_task) if t is not None]
        for task in pullers:
            task.cancel()
        await asyncio.gather(*pullers, return_exceptions=True)
        for held in [h for h in self._held.values() if h.job.model == lane.model]:
            await self._settle(held, "nak")
        for source in (lane.source, lane.batch_source):
            if source is not None:
                await source.close()
        await self.loader.evict(lane)
        log.info("stopped serving %s", lane.model)

    # Pulling ---------------------------------------------------------------------------

    async def _pull(self, lane: Lane) -> None:
        assert lane.source is not None
        max_held = self.settings.worker.max_held_jobs
        while not self._stopping:
            free = max_held - len(self._held)
            # Enough pending inputs for the batcher to group by length (see batcher.py).
            queued_limit = _POOL_BATCHES * lane.spec.profile.max_batch_items
            # Only live work counts here: batch-lane work never keeps live work unpulled.
            if free <= 0 or lane.interactive_queued >= queued_limit:
                self._room.clear()
                await self._room.wait()
                continue
            try:
                deliveries = await lane.source.fetch(min(free, 64), max_wait=1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a reconnect in progress; try again shortly
                log.warning("fetch for %s failed: %r", lane.model, exc)
                await asyncio.sleep(0.5)
                continue
            if deliveries:
                await self._admit(lane, deliveries)

    def _batch_lane_room(self, lane: Lane) -> int:
        """How many batch-lane items to pull now: none while any interactive work is
        pending on this worker, and never more than half the held-job slots or about two
        batches of inputs, so live work always finds room."""
        if any(other.interactive_queued for other in self._lanes.values()):
            return 0
        if lane.batch_queued() >= 2 * lane.spec.profile.max_batch_items:
            return 0
        held_batch = sum(1 for held in self._held.values() if held.batch_lane)
        max_held = self.settings.worker.max_held_jobs
        most = _BATCH_LANE_LIVE_FETCH if self._live_traffic_about() else 16
        return max(0, min(max_held // 2 - held_batch, max_held - len(self._held), most))

    async def _pull_batch_lane(self, lane: Lane) -> None:
        assert lane.batch_source is not None
        while not self._stopping:
            room = self._batch_lane_room(lane)
            if room <= 0:
                await asyncio.sleep(_BATCH_LANE_POLL)
                continue
            try:
                deliveries = await lane.batch_source.fetch(room, max_wait=0.5)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("batch-lane fetch for %s failed: %r", lane.model, exc)
                await asyncio.sleep(0.5)
                continue
            if deliveries:
                await self._admit(lane, deliveries, batch_lane=True)

    async def _admit(
        self, lane: Lane, deliveries: list[Delivery], batch_lane: bool = False
    ) -> None:
        now = time.time()
        if not batch_lane:
            self._last_interactive = self._clock()
        fresh: list[HeldJob] = []
        for delivery in deliveries:
            job = await read_job(
                self.payloads,
                self.dead_letters,
                delivery,
                self.settings.nats.max_deliver,
                self.worker_id,
            )
            if job is None:
                continue
            if job.request_id in self._cancelled:
                with contextlib.suppress(Exception):
                    await delivery.ack()
                continue
            held = HeldJob(delivery, job, batch_lane)
            if job.deadline <= now:
                await self._fail(
                    held,
                    ErrorKind.DEADLINE_EXCEEDED,
                    "the request's deadline passed before it ran",
                    settle="ack",
                )
                continue
            self._held[id(held)] = held
            fresh.append(held)
        if not fresh:
            return
        if lane.state != "resident":
            lane.waiting.extend(fresh)
            if lane.state in ("unloaded", "failed"):
                self._loading.add(asyncio.create_task(self._make_resident(lane)))
            return
        await self._queue(lane, fresh)

    async def _queue(self, lane: Lane, jobs: list[HeldJob]) -> None:
        """Tokenize jobs for a resident model into its batchers."""
        loop = asyncio.get_running_loop()
        prepared = await loop.run_in_executor(self._tokenize, _prepare, lane.adapter, jobs)
        for held, tokens in zip(jobs, prepared, strict=True):
            if held.done:
                continue
            if isinstance(tokens, str):
                await self._fail(held, ErrorKind.INVALID_INPUT, tokens, settle="term")
                continue
            if not getattr(held.job, "truncate", True):
                too_long = next((i for i, t in enumerate(tokens) if t.truncated), None)
                if too_long is not None:
                    message = _too_long(held, too_long, tokens[too_long], lane.adapter.max_length)
                    await self._fail(held, ErrorKind.INVALID_INPUT, message, settle="term")
                    continue
            if held.op not in lane.spec.tasks:
                await self._fail(
                    held,
                    ErrorKind.INVALID_INPUT,
                    f"model {lane.model!r} does not serve {held.op}",
                    settle="term",
                )
                continue
            units = held.start(tokens)
            if units:
                lane.batcher(held.op, held.job.adapter, held.batch_lane).add(units)
            else:
                await self._answer(held, lane)
        self._wake.set()

    async def _make_resident(self, lane: Lane) -> None:
        task = asyncio.current_task()
        if task is not None:
            task.add_done_callback(self._loading.discard)
        try:
            await self.loader.ensure_resident(lane, self._lanes.values())
        except LoadError as exc:
            log.error("%s", exc)
            waiting, lane.waiting = lane.waiting, []
            for held in waiting:
                await self._fail(held, ErrorKind.UNAVAILABLE, str(exc), settle="term")
            return
        waiting, lane.waiting = lane.waiting, []
        await self._queue(lane, [h for h in waiting if not h.done])

    # Batching and running ----------------------------------------------------------------

    async def _schedule(self) -> None:
        while True:
            self._wake.clear()
            due, wake_at = self._next_due()
            if due is None:
                timeout = None if wake_at is None else max(0.0, wake_at - self._clock())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            lane, key = due
            batcher = lane.batchers[key]
            await self._drop_expired(batcher)
            threads = lane.spec.profile.threads or self._full_threads
            share = 1.0
            if key[2]:
                live = self._live_traffic_about()
                share = self._batch_slice_share(lane, batcher, 1 if live else _IDLE_SLICES)
                if live:  # leave half the cores to the live path while it is busy
                    threads = max(1, threads // 2)
            await self._run_batch(lane, key[0], key[1], batcher.take(share), threads)

    def _next_due(self) -> tuple[tuple[Lane, BatcherKey] | None, float | None]:
        """The batch due soonest on a resident model, if due now; else when one will be.
        Batch-lane work runs only when no interactive work is pending at all: a batch
        job fills spare capacity and never makes a live request wait for its turn."""
        for batch_lane in (False, True):
            best: tuple[float, Lane, BatcherKey] | None = None
            for lane in self._lanes.values():
                if lane.state != "resident":
                    continue
                for key, batcher in lane.batchers.items():
                    if key[2] != batch_lane:
                        continue
                    at = batcher.ready_at()
                    if at is not None and (best is None or at < best[0]):
                        best = (at, lane, key)
            if best is None:
                continue
            if best[0] <= self._clock():
                return (best[1], best[2]), None
            return None, best[0]
        return None, None

    def _live_traffic_about(self) -> bool:
        return self._clock() - self._last_interactive < _LIVE_TRAFFIC_HORIZON

    def _batch_slice_share(self, lane: Lane, batcher: Batcher[Unit], slices: int) -> float:
        """The share of the token budget a batch-lane forward may take: as many tokens as
        the model runs in `slices` x `batch_slice_ms` (from its measured cost per token),
        so a live request that arrives during one waits for a short forward pass, not a
        full one. Until measured, one input at a time."""
        if lane.seconds_per_token <= 0:
            return 0.0
        budget = slices * self.settings.worker.batch_slice_ms / 1000
        tokens = budget / lane.seconds_per_token
        return min(1.0, tokens / batcher.profile.max_batch_tokens)

    async def _run_batch(
        self, lane: Lane, op: str, lora: str, batch: list[Unit], threads: int
    ) -> None:
        batch = [u for u in batch if not u.held.done]
        if not batch:
            self._room.set()  # the inputs taken were queued room too
            return
        lane.running += 1
        self.residency.touch(lane.model)
        try:
            if lora:
                try:
                    await self.loader.ensure_lora(lane, lora)
                except LoadError as exc:
                    for held in _jobs_of(batch):
                        kind = ErrorKind.NOT_FOUND if exc.not_found else ErrorKind.UNAVAILABLE
                        await self._fail(held, kind, str(exc), settle="term")
                    return
            loop = asyncio.get_running_loop()
            toks = [u.tok for u in batch]
            started, wall_started = self._clock(), time.time()
            outputs, errors = await loop.run_in_executor(
                self._forward, _forward_isolating, lane.adapter, op, lora, toks, threads
            )
            seconds = self._clock() - started
            padded = len(batch) * max(u.cost for u in batch)
            fill = padded / max(1, lane.spec.profile.max_batch_tokens)
            self.metrics.batch(lane.model, op, len(batch), padded, seconds, fill)
            if telemetry.tracing():
                _note_forward(batch, wall_started, wall_started + seconds, padded)
            if errors:
                # Only the jobs whose own inputs failed retry; their batch mates are answered.
                failed: dict[int, tuple[HeldJob, str]] = {}
                for i, error in errors.items():
                    failed.setdefault(id(batch[i].held), (batch[i].held, error))
                log.error(
                    "forward pass failed for %s on %d of %d inputs (%d jobs): %s",
                    lane.model,
                    len(errors),
                    len(batch),
                    len(failed),
                    next(iter(errors.values())),
                )
                for held, error in failed.values():
                    await self._retry_or_fail(held, error)
            else:
                lane.note_forward(seconds, padded)
            self.batches_run += 1
            self.batch_sizes.append(len(batch))
            for unit, output in zip(batch, outputs, strict=True):
                held = unit.held
                if output is not None and not held.done and held.fill(unit.row, output):
                    await self._answer(held, lane)
        finally:
            lane.running -= 1
            self.loader.notify_idle()

    async def _drop_expired(self, batcher: Batcher[Unit]) -> None:
        now = time.time()
        dropped = batcher.drop(lambda u: not u.held.done and u.held.job.deadline > now)
        for held in _jobs_of(dropped):
            if not held.done:
                await self._fail(
                    held,
                    ErrorKind.DEADLINE_EXCEEDED,
                    "the request's deadline passed before it ran",
                    settle="ack",
                )

    # Settling ------------------------------------------------------------------------------

    async def _answer(self, held: HeldJob, lane: Lane) -> None:
        try:
            result = build_result(held, lane.adapter)
        except Exception:
            log.exception("post-processing failed for %s", held.job.request_id)
            await self._fail(held, ErrorKind.INTERNAL, "post-processing failed", settle="term")
            return
        job = held.job
        try:
            message, _ = await self.payloads.offload(
                encode(result), job.request_id, job.part, job.reply_to, "result"
            )
        except PayloadStoreError as exc:
            message = "the reply is too large for one message and the payload store failed"
            await self._fail(held, ErrorKind.UNAVAILABLE, f"{message}: {exc}", settle="term")
            return
        publish_started = time.time()
        try:
            await self.bus.publish(job.reply_to, message)
        except Exception as exc:  # leave it unacked: it is redelivered and answered again
            log.warning("reply for %s failed: %r", held.job.request_id, exc)
            self._release(held)
            return
        await self._settle(held, "ack")
        if held.trace is not None:
            _record_spans(held, lane.model, publish_started, time.time())

    async def _fail(self, held: HeldJob, kind: ErrorKind, message: str, settle: str) -> None:
        job = held.job
        param = {ErrorKind.INVALID_INPUT: "input", ErrorKind.NOT_FOUND: "model"}.get(kind, "")
        failure = JobFailed(
            request_id=job.request_id, part=job.part, kind=kind, message=message, param=param
        )
        try:
            await self.bus.publish(job.reply_to, encode(failure))
        except Exception as exc:
            log.warning("failure reply for %s failed: %r", job.request_id, exc)
        await self._settle(held, settle)

    async def _retry_or_fail(self, held: HeldJob, error: str) -> None:
        """Retry a job whose inputs failed the forward pass; on its last delivery keep it
        as a dead letter (which answers its request) instead."""
        delivery = held.delivery
        if delivery.num_delivered < self.settings.nats.max_deliver:
            await self._settle(held, "nak", delay=1.0)
            return
        self._release(held)
        await self.dead_letters.bury_delivery(
            delivery, reason="max_deliver", error=error, worker_id=self.worker_id
        )
        await self._settle(held, "term")

    async def _settle(self, held: HeldJob, how: str, delay: float = 0.0) -> None:
        self._release(held)
        try:
            if how == "ack":
                await held.delivery.ack()
            elif how == "term":
                await held.delivery.term()
            else:
                await held.delivery.nak(delay)
        except Exception as exc:  # the server redelivers it after ack_wait
            log.warning("could not %s %s: %r", how, held.job.request_id, exc)

    def _on_cancel(self, payload: bytes) -> None:
        """Drop a cancelled request's held items (a running batch skips their rows)."""
        request_id = payload.decode(errors="replace")
        self._cancelled.add(request_id)
        cancelled = [h for h in self._held.values() if h.job.request_id == request_id]
        if not cancelled:
            return
        for held in cancelled:
            self._release(held)  # now, so no batch formed from here on includes it
            task = asyncio.create_task(self._settle(held, "ack"))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
        for lane in self._lanes.values():  # their queued inputs free room for other work
            lane.waiting = [h for h in lane.waiting if not h.done]
            for batcher in lane.batchers.values():
                batcher.drop(lambda u: not u.held.done)
        self._signal()

    def _release(self, held: HeldJob) -> None:
        held.done = True
        if self._held.pop(id(held), None) is not None:
            self._room.set()

    def _signal(self) -> None:
        self._wake.set()
        self._room.set()

    # Background ------------------------------------------------------------------------

    async def _keepalive(self) -> None:
        every = max(0.2, self.settings.nats.ack_wait / 3)
        while True:
            await asyncio.sleep(every)
            now = self._clock()
            for held in list(self._held.values()):
                if now - held.last_progress >= every:
                    held.last_progress = now
                    try:
                        await held.delivery.in_progress()
                    except Exception as exc:
                        log.debug("in_progress failed: %r", exc)

    async def _heartbeat(self) -> None:
        while True:
            await self._send_heartbeat()
            await asyncio.sleep(self.settings.worker.heartbeat_interval)

    async def _send_heartbeat(self) -> None:
        r = self.residency
        beat = WorkerHeartbeat(
            worker_id=self.worker_id,
            models=sorted(self._served),
            state=self._state,  # type: ignore[arg-type]
            sent_at=time.time(),
            resident=sorted(r.resident),
            resident_bytes=r.used,
            memory_budget=r.budget,
            loads=r.loads,
            evictions=r.evictions,
            **self.metrics.rates(),
        )
        try:
            await self.bus.publish(self.subjects.heartbeat, encode(beat))
        except Exception as exc:
            log.debug("heartbeat failed: %r", exc)


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


def _jobs_of(units: list[Unit]) -> list[HeldJob]:
    return list({id(u.held): u.held for u in units}.values())


def _forward(adapter: EncoderAdapter, op: str, lora: str, toks: list[Tokenized], threads: int):
    """On the forward thread: one batch, with its LoRA adapter active (or the base), on
    `threads` intra-op threads."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if adapter.lora is None:
        return adapter.forward(op, toks)
    with adapter.lora.active(lora):
        return adapter.forward(op, toks)


def _forward_isolating(
    adapter: EncoderAdapter, op: str, lora: str, toks: list[Tokenized], threads: int
) -> tuple[list[Any], dict[int, str]]:
    """`_forward`, and when it raises, the batch again in halves down to single inputs,
    so one poison input fails alone (at a cost of about 2 log2(n) extra passes, only on
    failure). Returns each input's output (None where it failed) and the failures by
    position."""
    try:
        return list(_forward(adapter, op, lora, toks, threads)), {}
    except Exception as exc:
        if len(toks) == 1:
            log.debug("forward failed on one input", exc_info=True)
            return [None], {0: f"{type(exc).__name__}: {exc}"[:500]}
    half = len(toks) // 2
    left, left_errors = _forward_isolating(adapter, op, lora, toks[:half], threads)
    right, right_errors = _forward_isolating(adapter, op, lora, toks[half:], threads)
    errors = {**left_errors, **{half + i: e for i, e in right_errors.items()}}
    return left + right, errors


def _prepare(adapter: EncoderAdapter, jobs: list[HeldJob]) -> list[list[Tokenized] | str]:
    """Each job's rows; a job whose inputs the model cannot take gets an error message."""
    out: list[list[Tokenized] | str] = []
    for held in jobs:
        try:
            out.append(adapter.units(held.job))
        except ValueError as exc:
            out.append(str(exc))
    return out


def _too_long(held: HeldJob, index: int, tok: Tokenized, limit: int) -> str:
    return (
        f"input {held.job.first_index + index} has {tok.full_length} tokens, more than the "
        f"model's maximum of {limit}; shorten it or send truncate=true"
    )
