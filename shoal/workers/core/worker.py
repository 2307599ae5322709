"""The worker core: delivery, for every kind of worker.

One `Worker` runs one `WorkerKind` (kind.py) in a worker process. The core owns
everything between the queue and the kind, on one event loop:

- the served models: it follows the registry (following.py: models registered at run
  time are served, removed ones dropped, a changed spec applied live where the kind can,
  else served anew, what failed tried again) and, per model, pulls its interactive and
  its batch lane from their durable consumers whenever the kind says it has room;
- admission: each item is read (an offloaded one fetched from the payload store; what
  cannot be read is settled in intake.py), and dropped unrun when its request was
  cancelled or its deadline passed, or refused when its model does not serve its op;
  the rest goes to the kind;
- settling: one table (outcomes.py) says what each outcome tells the queue and the
  requester; a job that failed its last delivery becomes a dead letter;
- keepalives (`in_progress` for jobs held a while, so a long queue inside the worker is
  not mistaken for a dead worker), heartbeats to the gateways, cancels (a cancelled
  request's held jobs are dropped and acked), and a clean stop: pulling stops, held work
  gets `DRAIN_SECONDS` to finish, the rest is returned to the queue at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time

from ...config import Settings
from ...lifecycle import DRAIN_SECONDS
from ...model_registry import LiveRegistry
from ...queue import Bus, JobFailed, Subjects, WorkerHeartbeat
from ...queue.dead_letters import DeadLetters
from ...queue.errors import PayloadStoreError
from ...queue.messages import FailureCode, Reply, encode
from ...queue.payloads import PayloadStore, open_payload_store
from ...queue.provision import ensure_work_stream
from ...queue.source import Delivery
from .cancels import CancelledRequests
from .following import follow, reconcile
from .held import Held
from .intake import read_job
from .kind import WorkerKind
from .outcomes import SETTLE, Outcome
from .served import Served, close_sources, tell_queue

__all__ = ["Worker"]

log = logging.getLogger(__name__)

_FETCH_MAX = 64
"""Most items one fetch asks for."""
_BATCH_LANE_POLL = 0.02
"""Seconds between looks for room to pull batch-lane work into: its room depends on
live traffic, which no event announces."""
_PARAM_OF = {FailureCode.INVALID_INPUT: "input", FailureCode.NOT_FOUND: "model"}
"""The request field a failure names, unless the kind names another."""


class Worker:
    """Delivery for one worker process; `kind` does the work (see the module doc)."""

    def __init__(
        self,
        settings: Settings,
        bus: Bus,
        registry: LiveRegistry,
        kind: WorkerKind,
        worker_id: str | None = None,
        payloads: PayloadStore | None = None,
    ) -> None:
        """`payloads`: where items and replies too large for a message travel (default:
        from the settings)."""
        self.settings = settings
        self.bus = bus
        self.registry = registry
        self.kind = kind
        self.payloads = payloads or open_payload_store(settings, bus)
        self.subjects = Subjects(settings.nats.subject_prefix)
        self.worker_id = worker_id or f"{kind.name}-{secrets.token_hex(4)}"
        self.dead_letters = DeadLetters(bus, settings.nats, self.subjects)
        self.models: dict[str, Served] = {}
        self.held: dict[int, Held] = {}
        self.stopping = False
        self._state = "loading"
        self._room = asyncio.Event()
        self._released = asyncio.Event()
        self._changed = asyncio.Event()
        self._settling: set[asyncio.Task] = set()
        self._cancelled = CancelledRequests(settings.gateway.request_timeout + 60)
        kind.attach(self)

    @property
    def state(self) -> str:
        """`loading`, `ready` or `stopping`, as its heartbeats say."""
        return self._state

    # Lifecycle -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then drain and leave cleanly. Cancelled (a stop
        while still starting), it leaves at once, returning what it holds."""
        heartbeat = asyncio.create_task(self._heartbeat())
        # From the start: the core pulls for its models while the kind starts (loads its
        # pinned models), and what it holds meanwhile must not be redelivered.
        background = [asyncio.create_task(self._keepalive())]
        try:
            await ensure_work_stream(self.bus, self.settings.nats, self.subjects)
            await self.bus.subscribe(self.subjects.cancel, self._on_cancel)
            if failed := await reconcile(self):
                raise next(iter(failed.values()))  # at start, a model that fails is fatal
            await self.kind.start()
            self._state = "ready"
            await self._send_heartbeat()
            log.info(
                "%s %s ready: %s",
                self.kind.name,
                self.worker_id,
                ", ".join(self.kind.ready_models()),
            )
            self.registry.add_listener(self._changed.set)
            self._changed.set()  # what was registered while the kind started
            background.append(asyncio.create_task(follow(self, self._changed)))
            await stop.wait()
            await self._drain()
        finally:
            self.stopping = True
            for task in background:
                task.cancel()
            await self._stop_pulling()
            for held in list(self.held.values()):
                await self.settle(held, Outcome.RETURNED)
            for served in self.models.values():
                await close_sources(served.source, served.batch_source)
            await self.kind.stop()
            heartbeat.cancel()
            self._state = "stopping"
            await self._send_heartbeat()

    async def _drain(self) -> None:
        """Stop pulling; give held work `DRAIN_SECONDS` (at most `ack_wait`) to finish."""
        self.stopping = True
        await self._stop_pulling()
        deadline = time.monotonic() + min(self.settings.nats.ack_wait, DRAIN_SECONDS)
        while self.held and time.monotonic() < deadline and self.kind.can_finish():
            self._released.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), 0.5)

    async def _stop_pulling(self) -> None:
        pulls = [task for served in self.models.values() for task in served.pulls]
        for task in pulls:
            task.cancel()
        await asyncio.gather(*pulls, return_exceptions=True)

    # Pulling and admitting -----------------------------------------------------------

    async def pull(self, served: Served, batch_lane: bool) -> None:
        """Pull `served`'s lane into the kind while it has room, until stopped."""
        source = served.batch_source if batch_lane else served.source
        model = served.spec.id
        while not self.stopping:
            room = self.kind.room(model, batch_lane)
            if room <= 0:
                self._room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._room.wait(), _BATCH_LANE_POLL if batch_lane else 1.0
                    )
                continue
            try:
                deliveries = await source.fetch(
                    min(room, _FETCH_MAX), max_wait=0.5 if batch_lane else 1.0
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a reconnect in progress; try again shortly
                log.warning(
                    "%s fetch for %s failed: %r", "batch-lane" if batch_lane else "live", model, exc
                )
                await asyncio.sleep(0.5)
                continue
            if deliveries:
                await self._admit(served, deliveries, batch_lane)

    async def _admit(self, served: Served, deliveries: list[Delivery], batch_lane: bool) -> None:
        now = time.time()
        fresh: list[Held] = []
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
            if job.request_id in self._cancelled:  # its client left while it was queued
                with contextlib.suppress(Exception):
                    await delivery.ack()
                continue
            held = self.kind.hold(delivery, job, batch_lane)
            self.held[id(held)] = held
            if job.deadline <= now:
                await self.settle(
                    held, Outcome.EXPIRED, "the request's deadline passed before it ran"
                )
            elif not served.spec.serves(held.op):
                message = f"model {served.spec.id!r} does not serve {held.op}"
                await self.settle(held, Outcome.INVALID, message)
            else:
                fresh.append(held)
        if fresh:
            await self.kind.accept(served.spec.id, fresh, batch_lane)

    # Replying and settling -----------------------------------------------------------

    async def publish(self, held: Held, message: bytes) -> bool:
        """Publish `message` to the job's reply subject; False (logged) if it fails."""
        try:
            await self.bus.publish(held.job.reply_to, message)
            return True
        except Exception as exc:
            log.warning("reply for %s not sent: %r", held.request_id, exc)
            return False

    async def answer(self, held: Held, result: Reply) -> bool:
        """Send `result` (through the payload store when too large for a message) and
        settle the job ANSWERED; True if it was answered."""
        job = held.job
        try:
            message, _ = await self.payloads.offload(
                encode(result), job.request_id, job.part, job.reply_to, "result"
            )
        except PayloadStoreError as exc:
            text = "the reply is too large for one message and the payload store failed"
            await self.settle(held, Outcome.UNAVAILABLE, f"{text}: {exc}")
            return False
        if not await self.publish(held, message):
            await self.settle(held, Outcome.UNSENT)  # redelivered, answered again
            return False
        await self.settle(held, Outcome.ANSWERED)
        return True

    async def settle(
        self, held: Held, outcome: Outcome, message: str = "", param: str | None = None
    ) -> None:
        """End `held` as `SETTLE[outcome]` says (the failure it sends says `message` and
        names `param`); once only."""
        if held.settled:
            return
        held.settled = True
        self.release(held)
        rule = SETTLE[outcome]
        action, delay = rule.action, rule.delay
        if outcome is Outcome.FAILED:
            log.error("%s part %d failed: %s", held.request_id, held.job.part, message)
            if held.delivery.num_delivered >= self.settings.nats.max_deliver:
                await self.dead_letters.bury_delivery(
                    held.delivery, reason="max_deliver", error=message, worker_id=self.worker_id
                )
                action = "term"
            elif self.stopping:
                delay = 0.0  # another worker may take it at once
        elif rule.failure is not None:
            job = held.job
            failure = JobFailed(
                request_id=job.request_id,
                part=job.part,
                code=rule.failure,
                message=message,
                param=param if param is not None else _PARAM_OF.get(rule.failure, ""),
            )
            await self.publish(held, encode(failure))
        await tell_queue(held, action, delay)

    def release(self, held: Held) -> None:
        """Stop holding `held` (it is settled, or about to be): its room is free again."""
        held.done = True
        if self.held.pop(id(held), None) is not None:
            self._released.set()
            self._room.set()

    def signal_room(self) -> None:
        """The kind has room again: pull."""
        self._room.set()

    def _on_cancel(self, payload: bytes) -> None:
        """Drop a cancelled request's held jobs at once and ack them."""
        request_id = payload.decode(errors="replace")
        self._cancelled.add(request_id)
        cancelled = [h for h in self.held.values() if h.request_id == request_id]
        if not cancelled:
            return
        for held in cancelled:
            self.release(held)  # now, so no batch formed from here on includes it
        self.kind.drop(cancelled)
        for held in cancelled:
            task = asyncio.create_task(self.settle(held, Outcome.CANCELLED))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)

    # Background ------------------------------------------------------------------------

    async def _keepalive(self) -> None:
        every = max(0.2, self.settings.nats.ack_wait / 3)
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for held in list(self.held.values()):
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
        fields = {"models": sorted(self.models), **self.kind.heartbeat()}
        beat = WorkerHeartbeat(
            worker_id=self.worker_id,
            state=self._state,  # type: ignore[arg-type]
            sent_at=time.time(),
            **fields,
        )
        try:
            await self.bus.publish(self.subjects.heartbeat, encode(beat))
        except Exception as exc:
            log.debug("heartbeat failed: %r", exc)
