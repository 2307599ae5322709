"""The gateway's side of the queue: publish a request's jobs, gather their replies.

One subscription per gateway receives every reply (`{prefix}.reply.{gateway_id}`); a reply
names its request and part, so a request with many parts needs no subscription of its
own. A part answered twice (a redelivered job whose first worker died after replying)
counts once; a reply for a request nobody waits for any more is dropped.

Heartbeats from workers tell which models have a live worker, for `/ready` and for
answering 503 at once instead of queueing work no one will take.

Items and replies too large for one NATS message go through the payload store
(payloads.py); the dispatcher deletes a request's stored items when it is over, however
it ends, and a stored reply once read.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence

import msgspec

from .. import telemetry
from ..config import GatewaySettings, NatsSettings
from .backlog import BacklogMonitor
from .errors import (
    BacklogTooLongError,
    DeadlineExceededError,
    JobFailedError,
    NoWorkerError,
    QueueUnavailableError,
)
from .heartbeat import WorkerHeartbeat, decode_heartbeat
from .messages import (
    OP_OF_JOB,
    FailureCode,
    GenerateChunk,
    GenerateJob,
    Job,
    JobFailed,
    PayloadRef,
    Reply,
    Result,
    decode_reply,
    encode,
)
from .nats import Bus
from .objects import ObjectStoreError
from .payloads import PayloadStore
from .provision import ensure_work_stream
from .subjects import Lane, Subjects

__all__ = ["Dispatcher", "LiveWorker"]

log = logging.getLogger(__name__)


class LiveWorker(msgspec.Struct):
    """What the gateway knows of one worker from its heartbeats."""

    heartbeat: WorkerHeartbeat
    seen_at: float


class _Pending:
    """The replies of one request, in part order."""

    __slots__ = ("future", "remaining", "results")

    def __init__(self, parts: int) -> None:
        self.results: list[Result | None] = [None] * parts
        self.remaining = parts
        self.future: asyncio.Future[list[Result]] = asyncio.get_running_loop().create_future()

    def accept(self, reply: Result | JobFailed) -> None:
        if self.future.done() or not 0 <= reply.part < len(self.results):
            return
        if isinstance(reply, JobFailed):
            self.future.set_exception(JobFailedError(reply))
            return
        if self.results[reply.part] is not None:
            return  # a duplicate from a redelivery
        self.results[reply.part] = reply
        self.remaining -= 1
        if self.remaining == 0:
            self.future.set_result(self.results)  # type: ignore[arg-type]


class Dispatcher:
    """The gateway's side of the queue: publishes a request's jobs, gathers their replies on
    its inbox, streams generation chunks, cancels, and knows the live workers."""

    def __init__(
        self,
        bus: Bus,
        subjects: Subjects,
        gateway: GatewaySettings,
        nats: NatsSettings,
        payloads: PayloadStore,
    ) -> None:
        self._bus = bus
        self._payloads = payloads
        self._subjects = subjects
        self._gateway = gateway
        self._nats = nats
        self.gateway_id = secrets.token_hex(6)
        self.reply_subject = subjects.reply(self.gateway_id)
        self._ids = itertools.count()
        self._pending: dict[str, _Pending] = {}
        self._streams: dict[str, asyncio.Queue] = {}
        self._workers: dict[str, LiveWorker] = {}
        self._started_at = time.time()
        self._fetching: set[asyncio.Task] = set()
        self.backlog = BacklogMonitor(bus, nats.stream, subjects)

    async def start(self) -> None:
        await ensure_work_stream(self._bus, self._nats, self._subjects)
        await self._bus.subscribe(self.reply_subject, self._on_reply)
        await self._bus.subscribe(self._subjects.heartbeat, self._on_heartbeat)
        self.backlog.start()

    async def close(self) -> None:
        await self.backlog.close()

    def new_request_id(self) -> str:
        return f"{self.gateway_id}-{next(self._ids)}"

    @property
    def in_flight(self) -> int:
        return len(self._pending) + len(self._streams)

    async def submit(
        self, request_id: str, jobs: Sequence[Job], lane: Lane, deadline: float
    ) -> list[Result]:
        """Publish `jobs` (the parts of one request) and return their results in order.

        Raises:
            NoWorkerError: no live worker serves the model and the policy is `reject`.
            QueueFullError, QueueUnavailableError: the work was not accepted.
            DeadlineExceededError: accepted, but not all answered by `deadline`.
            JobFailedError: a worker answered a part with a failure.
        """
        model = jobs[0].model
        if self._gateway.no_worker_policy == "reject" and not self.has_worker_for(model):
            raise NoWorkerError(model)
        if not self._bus.is_connected:
            raise QueueUnavailableError("not connected to NATS")
        if lane == "interactive" and self.has_worker_for(model):
            # (With no live worker there is no rate to judge by: the policy above decides.)
            self._check_backlog(model, deadline)
            self.backlog.admitted(model, len(jobs))
        subject = self._subjects.work(lane, model, OP_OF_JOB[type(jobs[0])])  # type: ignore[arg-type]
        pending = self._pending[request_id] = _Pending(len(jobs))
        stored: list[str] = []
        published = False
        try:
            await self._publish(subject, jobs, stored)
            published = True
            try:
                return await asyncio.wait_for(pending.future, deadline - time.time())
            except TimeoutError:
                raise DeadlineExceededError() from None
        finally:
            del self._pending[request_id]
            await self._payloads.discard(stored)
            if published and pending.remaining:
                # Nobody waits for the rest (deadline, a failed part, the client left): workers drop
                # its queued and running parts instead of computing unread answers, so they
                # are no backlog for the next request either.
                if lane == "interactive":
                    self.backlog.discount(model, pending.remaining)
                await self.cancel(request_id)

    async def _publish(self, subject: str, jobs: Sequence[Job], stored: list[str]) -> None:
        """Publish the jobs, each too large for a message through the payload store
        (its key added to `stored`).

        Raises:
            PayloadStoreError: an item too large for a message could not be stored.
        """
        items = []
        for job in jobs:
            message, key = await self._payloads.offload(
                encode(job), job.request_id, job.part, job.reply_to, "job"
            )
            if key is not None:
                stored.append(key)
            items.append((subject, message, f"{job.request_id}.{job.part}"))
        headers: dict[str, str] = {}
        if telemetry.tracing():  # the request's span is current: workers continue its trace
            telemetry.inject(headers)
        await self._bus.publish_work(items, headers)

    async def stream(
        self,
        request_id: str,
        job: GenerateJob,
        lane: Lane,
        deadline: float,
        on_published: Callable[[], None] | None = None,
    ) -> AsyncIterator[GenerateChunk]:
        """Publish a generation job and yield its chunks as they come (raw: the caller
        assembles them with `StreamAssembler`); `on_published` is called once the queue
        holds the job. Leaving early (the client went away) cancels the job on its worker.

        Raises:
            NoWorkerError, QueueFullError, QueueUnavailableError: not accepted.
            DeadlineExceededError: no chunk for too long, or past the deadline.
            JobFailedError: the worker failed it.
        """
        if self._gateway.no_worker_policy == "reject" and not self.has_worker_for(job.model):
            raise NoWorkerError(job.model)
        if not self._bus.is_connected:
            raise QueueUnavailableError("not connected to NATS")
        queue: asyncio.Queue[GenerateChunk | JobFailed] = asyncio.Queue()
        self._streams[request_id] = queue
        finished = False
        stored: list[str] = []
        try:
            subject = self._subjects.work(lane, job.model, "generate")
            await self._publish(subject, [job], stored)
            if on_published is not None:
                on_published()
            while True:
                try:
                    reply = await asyncio.wait_for(queue.get(), deadline - time.time())
                except TimeoutError:
                    raise DeadlineExceededError() from None
                if isinstance(reply, JobFailed):
                    finished = True
                    raise JobFailedError(reply)
                yield reply
                if reply.done:
                    finished = True
                    return
        finally:
            del self._streams[request_id]
            await self._payloads.discard(stored)
            if not finished:
                await self.cancel(request_id)

    def _check_backlog(self, model: str, deadline: float) -> None:
        """Refuse live work that would sit behind the model's backlog past its deadline
        (batch-lane work is meant to wait)."""
        wait = self.backlog.wait_for(model)
        # A margin for the estimate's error (it lags a sudden burst): work admitted at the
        # edge mostly times out (perf/overload.py measures both).
        allowed = 0.6 * (deadline - time.time())
        if wait > allowed:
            raise BacklogTooLongError(model, wait, retry_after=max(1.0, wait - allowed))

    async def cancel(self, request_id: str) -> None:
        """Ask workers to stop the request's work: nobody waits for it any more."""
        with contextlib.suppress(Exception):
            await self._bus.publish(self._subjects.cancel, request_id.encode())

    def _on_reply(self, payload: bytes) -> None:
        try:
            reply = decode_reply(payload)
        except msgspec.DecodeError:
            log.warning("dropped an undecodable reply (%d bytes)", len(payload))
            return
        if isinstance(reply, PayloadRef):
            task = asyncio.create_task(self._fetch_reply(reply))
            self._fetching.add(task)
            task.add_done_callback(self._fetching.discard)
            return
        self._deliver(reply)

    async def _fetch_reply(self, ref: PayloadRef) -> None:
        """A reply that went through the payload store: read it, delete it, deliver it."""
        try:
            payload = await self._payloads.fetch(ref)
        except ObjectStoreError as exc:
            log.warning("dropped a stored reply for %s: %s", ref.request_id, exc)
            payload = b""
        finally:
            await self._payloads.discard([ref.key])
        try:
            reply = decode_reply(payload)
        except msgspec.DecodeError:
            reply = None
        if reply is None or isinstance(reply, PayloadRef):
            # Never a silent drop: the request fails now instead of timing out.
            reply = JobFailed(
                request_id=ref.request_id,
                part=ref.part,
                code=FailureCode.UNAVAILABLE,
                message="the reply could not be read from the payload store",
            )
        self._deliver(reply)

    def _deliver(self, reply: Reply) -> None:
        stream = self._streams.get(reply.request_id)
        if stream is not None:
            if isinstance(reply, (GenerateChunk, JobFailed)):
                stream.put_nowait(reply)
            return
        pending = self._pending.get(reply.request_id)
        if pending is not None and not isinstance(reply, GenerateChunk):
            pending.accept(reply)

    # Workers -----------------------------------------------------------------------

    def _on_heartbeat(self, payload: bytes) -> None:
        try:
            beat = decode_heartbeat(payload)
        except msgspec.DecodeError:
            return
        if beat.state == "stopping":
            self._workers.pop(beat.worker_id, None)
        else:
            self._workers[beat.worker_id] = LiveWorker(beat, time.monotonic())

    def live_workers(self) -> list[WorkerHeartbeat]:
        horizon = time.monotonic() - self._gateway.worker_ttl
        for worker_id in [w for w, live in self._workers.items() if live.seen_at < horizon]:
            del self._workers[worker_id]
        return [live.heartbeat for live in self._workers.values()]

    def has_worker_for(self, model: str) -> bool:
        return any(model in beat.models or "*" in beat.models for beat in self.live_workers())

    def ready_models(self) -> set[str]:
        """Models resident on some ready worker."""
        return {m for beat in self.live_workers() if beat.state == "ready" for m in beat.resident}

    def engines(self) -> dict[str, str]:
        """What runs each resident model (`openvino float32`), as its workers say; the
        workers of one model agree unless their profiles or machines differ."""
        found: dict[str, set[str]] = {}
        for beat in self.live_workers():
            for model, engine in beat.engines.items():
                found.setdefault(model, set()).add(engine)
        return {model: " | ".join(sorted(names)) for model, names in found.items()}
