"""The encoder worker: pull work, batch it by token cost, embed, reply, ack.

Tasks, all on one event loop:

- one pull task per served model fetches items from that model's durable consumer while
  the worker has room (`max_held_jobs` items held, about four batches of inputs queued),
  decodes them, tokenizes them on the tokenizer thread and queues their inputs in the
  model's batcher;
- one scheduler task owns the batchers: when one is ready it takes a batch, runs it on
  the single forward thread, scatters the rows back to their jobs, and
  replies and acks each job that is complete;
- a keepalive task sends `in_progress` for items held a while, so a long queue inside the
  worker is not mistaken for a dead worker;
- a heartbeat task tells gateways which models this worker serves and whether it is ready.

How each outcome settles its item:

| outcome                                  | reply           | settle           |
|------------------------------------------|-----------------|------------------|
| answered                                 | result          | ack              |
| undecodable item                         | failure, if its header reads | term |
| deadline passed before it ran            | failure         | ack              |
| invalid input (too long, bad token ids)  | failure         | term             |
| forward pass failed, deliveries left     | none            | nak(1 s)         |
| forward pass failed, last delivery       | failure         | term             |
| worker stopping with the item not run    | none            | nak (at once)    |
| worker killed                            | none            | none: redelivered after `ack_wait` |
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import msgspec

from ..config import Settings
from ..queue import Bus, Delivery, ErrorKind, JobFailed, Subjects, WorkerHeartbeat
from ..queue.messages import decode_job, decode_job_header, encode
from ..queue.provision import ensure_consumer, ensure_work_stream
from ..queue.source import WorkSource
from .adapters.base import EncoderAdapter, Tokenized
from .batcher import Batcher
from .held import HeldJob, Unit
from .results import build_result

__all__ = ["EncoderWorker"]

log = logging.getLogger(__name__)

_POOL_BATCHES = 4


class _Lane:
    """One served model: its adapter, a batcher per op (batches never mix ops) and the
    consumer it pulls from."""

    def __init__(self, adapter: EncoderAdapter, clock: Callable[[], float]) -> None:
        self.adapter = adapter
        self.batchers: dict[str, Batcher[Unit]] = {
            op: Batcher(adapter.spec.profile, clock) for op in adapter.spec.tasks
        }
        self.source: WorkSource | None = None

    @property
    def model(self) -> str:
        return self.adapter.spec.id

    @property
    def queued(self) -> int:
        return sum(len(b) for b in self.batchers.values())


class EncoderWorker:
    def __init__(
        self,
        settings: Settings,
        bus: Bus,
        adapters: Sequence[EncoderAdapter],
        worker_id: str | None = None,
    ) -> None:
        self.settings = settings
        self.bus = bus
        self.subjects = Subjects(settings.nats.subject_prefix)
        self.worker_id = worker_id or f"enc-{secrets.token_hex(4)}"
        self._clock = time.monotonic
        self._lanes = {a.spec.id: _Lane(a, self._clock) for a in adapters}
        self._held: dict[int, HeldJob] = {}
        self._state: str = "loading"
        self._stopping = False
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._forward = ThreadPoolExecutor(1, thread_name_prefix="shoal-forward")
        self._tokenize = ThreadPoolExecutor(1, thread_name_prefix="shoal-tokenize")
        self.batches_run = 0

    @property
    def state(self) -> str:
        """`loading`, `ready` or `stopping`, as its heartbeats say."""
        return self._state

    # Lifecycle -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then finish what is held and leave cleanly."""
        heartbeat = asyncio.create_task(self._heartbeat())
        try:
            await self._load()
            await self._subscribe()
            self._state = "ready"
            await self._send_heartbeat()
            log.info("worker %s ready: %s", self.worker_id, ", ".join(self._lanes))
            pullers = [asyncio.create_task(self._pull(lane)) for lane in self._lanes.values()]
            scheduler = asyncio.create_task(self._schedule())
            keepalive = asyncio.create_task(self._keepalive())
            await stop.wait()
            await self._shutdown(pullers, scheduler, keepalive)
        finally:
            heartbeat.cancel()
            self._state = "stopping"
            await self._send_heartbeat()
            self._forward.shutdown(wait=False, cancel_futures=True)
            self._tokenize.shutdown(wait=False, cancel_futures=True)

    async def _load(self) -> None:
        loop = asyncio.get_running_loop()
        for lane in self._lanes.values():
            await loop.run_in_executor(self._forward, lane.adapter.load)
            await loop.run_in_executor(self._forward, lane.adapter.warmup)

    async def _subscribe(self) -> None:
        nats = self.settings.nats
        await ensure_work_stream(self.bus, nats, self.subjects)
        for lane in self._lanes.values():
            consumer = await ensure_consumer(
                self.bus, nats, self.subjects, "interactive", lane.model
            )
            lane.source = await self.bus.puller(nats.stream, consumer)

    async def _shutdown(
        self, pullers: list[asyncio.Task], scheduler: asyncio.Task, keepalive: asyncio.Task
    ) -> None:
        self._stopping = True
        for task in pullers:
            task.cancel()
        await asyncio.gather(*pullers, return_exceptions=True)
        deadline = self._clock() + self.settings.nats.ack_wait
        while self._held and self._clock() < deadline:
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), 0.5)
        scheduler.cancel()
        keepalive.cancel()
        for held in list(self._held.values()):
            await self._settle(held, "nak")
        for lane in self._lanes.values():
            if lane.source is not None:
                await lane.source.close()

    # Pulling ---------------------------------------------------------------------------

    async def _pull(self, lane: _Lane) -> None:
        assert lane.source is not None
        max_held = self.settings.worker.max_held_jobs
        # Enough pending inputs for the batcher to group by length (see batcher.py).
        queued_limit = _POOL_BATCHES * lane.adapter.spec.profile.max_batch_items
        while not self._stopping:
            free = max_held - len(self._held)
            if free <= 0 or lane.queued >= queued_limit:
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

    async def _admit(self, lane: _Lane, deliveries: list[Delivery]) -> None:
        now = time.time()
        fresh: list[HeldJob] = []
        for delivery in deliveries:
            try:
                job = decode_job(delivery.data)
            except msgspec.DecodeError as exc:
                await self._refuse(delivery, exc)
                continue
            held = HeldJob(delivery, job)
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
        loop = asyncio.get_running_loop()
        prepared = await loop.run_in_executor(self._tokenize, _prepare, lane.adapter, fresh)
        for held, tokens in zip(fresh, prepared, strict=True):
            if isinstance(tokens, str):
                await self._fail(held, ErrorKind.INVALID_INPUT, tokens, settle="term")
                continue
            if not getattr(held.job, "truncate", True):
                too_long = next((i for i, t in enumerate(tokens) if t.truncated), None)
                if too_long is not None:
                    message = _too_long(held, too_long, tokens[too_long], lane.adapter.max_length)
                    await self._fail(held, ErrorKind.INVALID_INPUT, message, settle="term")
                    continue
            batcher = lane.batchers.get(held.op)
            if batcher is None:
                await self._fail(
                    held,
                    ErrorKind.INVALID_INPUT,
                    f"model {lane.model!r} does not serve {held.op}",
                    settle="term",
                )
                continue
            units = held.start(tokens)
            if units:
                batcher.add(units)
            else:
                await self._answer(held, lane)
        self._wake.set()

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
            lane, op = due
            batcher = lane.batchers[op]
            await self._drop_expired(batcher)
            await self._run_batch(lane, op, batcher.take())

    def _next_due(self) -> tuple[tuple[_Lane, str] | None, float | None]:
        """The (lane, op) whose batch is due soonest, if due now; else when one will be."""
        best: tuple[float, _Lane, str] | None = None
        for lane in self._lanes.values():
            for op, batcher in lane.batchers.items():
                at = batcher.ready_at()
                if at is not None and (best is None or at < best[0]):
                    best = (at, lane, op)
        if best is None:
            return None, None
        if best[0] <= self._clock():
            return (best[1], best[2]), None
        return None, best[0]

    async def _run_batch(self, lane: _Lane, op: str, batch: list[Unit]) -> None:
        batch = [u for u in batch if not u.held.done]
        if not batch:
            return
        loop = asyncio.get_running_loop()
        try:
            outputs = await loop.run_in_executor(
                self._forward, lane.adapter.forward, op, [u.tok for u in batch]
            )
        except Exception:
            log.exception("forward pass failed for %s (batch of %d)", lane.model, len(batch))
            for held in {id(u.held): u.held for u in batch}.values():
                await self._retry_or_fail(held)
            return
        self.batches_run += 1
        for unit, output in zip(batch, outputs, strict=True):
            held = unit.held
            if not held.done and held.fill(unit.row, output):
                await self._answer(held, lane)

    async def _drop_expired(self, batcher: Batcher[Unit]) -> None:
        now = time.time()
        dropped = batcher.drop(lambda u: not u.held.done and u.held.job.deadline > now)
        for held in {id(u.held): u.held for u in dropped}.values():
            if not held.done:
                await self._fail(
                    held,
                    ErrorKind.DEADLINE_EXCEEDED,
                    "the request's deadline passed before it ran",
                    settle="ack",
                )

    # Settling ------------------------------------------------------------------------------

    async def _answer(self, held: HeldJob, lane: _Lane) -> None:
        try:
            result = build_result(held, lane.adapter)
        except Exception:
            log.exception("post-processing failed for %s", held.job.request_id)
            await self._fail(held, ErrorKind.INTERNAL, "post-processing failed", settle="term")
            return
        try:
            await self.bus.publish(held.job.reply_to, encode(result))
        except Exception as exc:  # leave it unacked: it is redelivered and answered again
            log.warning("reply for %s failed: %r", held.job.request_id, exc)
            self._release(held)
            return
        await self._settle(held, "ack")

    async def _fail(self, held: HeldJob, kind: ErrorKind, message: str, settle: str) -> None:
        job = held.job
        failure = JobFailed(
            request_id=job.request_id,
            part=job.part,
            kind=kind,
            message=message,
            param="input" if kind is ErrorKind.INVALID_INPUT else "",
        )
        try:
            await self.bus.publish(job.reply_to, encode(failure))
        except Exception as exc:
            log.warning("failure reply for %s failed: %r", job.request_id, exc)
        await self._settle(held, settle)

    async def _refuse(self, delivery: Delivery, exc: Exception) -> None:
        """An item this worker cannot read: answer it if its header is readable, then
        drop it for good."""
        log.error("undecodable work item (%d bytes): %s", len(delivery.data), exc)
        try:
            header = decode_job_header(delivery.data)
        except msgspec.DecodeError:
            header = None
        if header is not None:
            failure = JobFailed(
                request_id=header.request_id,
                part=header.part,
                kind=ErrorKind.INTERNAL,
                message=f"the worker could not read this work item: {exc}",
            )
            with contextlib.suppress(Exception):
                await self.bus.publish(header.reply_to, encode(failure))
        with contextlib.suppress(Exception):
            await delivery.term()

    async def _retry_or_fail(self, held: HeldJob) -> None:
        if held.delivery.num_delivered < self.settings.nats.max_deliver:
            await self._settle(held, "nak", delay=1.0)
        else:
            await self._fail(
                held,
                ErrorKind.INTERNAL,
                "the model failed on this input on every attempt",
                settle="term",
            )

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

    def _release(self, held: HeldJob) -> None:
        held.done = True
        if self._held.pop(id(held), None) is not None:
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
        beat = WorkerHeartbeat(
            worker_id=self.worker_id,
            models=list(self._lanes),
            state=self._state,
            sent_at=time.time(),
        )  # type: ignore[arg-type]
        try:
            await self.bus.publish(self.subjects.heartbeat, encode(beat))
        except Exception as exc:
            log.debug("heartbeat failed: %r", exc)


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
        f"input {held.job.first_index + index} has {tok.full_length} tokens, more than the model's "
        f"maximum of {limit}; shorten it or send truncate=true"
    )
