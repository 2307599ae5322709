"""The generation worker: pull generation jobs into free slots, stream their tokens back.

For each served model it pulls jobs only while the runtime has free slots (so a busy
worker leaves work to idle ones), turns each job into its `n` sequences, and publishes
the runtime's tokens to the job's reply subject as `GenerateChunk`s, one per engine step
per job, numbered within this attempt. The job is acked when every choice has finished.
A cancel message (the client went away) stops the job's sequences and frees their slots.

| outcome                           | reply                         | settle          |
|-----------------------------------|-------------------------------|-----------------|
| all choices finished              | chunks, the last `done`       | ack             |
| prompt too long, bad input        | failure                       | term            |
| deadline passed before it ran     | failure                       | ack             |
| cancelled (client left), running  | none                          | ack             |
| or still queued when pulled       |                               |                 |
| runtime failed, deliveries left   | none                          | nak (new attempt) |
| runtime failed, last delivery     | failure; dead letter          | term            |
| worker stopping                   | none                          | nak             |
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor

from ...config import Settings
from ...model_registry import LiveRegistry, ModelSpec, SourceResolver
from ...queue import Bus, Delivery, ErrorKind, JobFailed, Subjects, WorkerHeartbeat
from ...queue.dead_letters import DeadLetters
from ...queue.messages import (
    ChoiceDelta,
    GenerateChunk,
    GenerateJob,
    TokenLogprob,
    encode,
)
from ...queue.payloads import PayloadStore, open_payload_store
from ...queue.provision import ensure_consumer, ensure_work_stream
from ..cancels import CancelledRequests
from ..intake import read_job, refuse
from ..observe import WorkerMetrics, job_context, record_job_spans
from .engine import SequenceRequest, TokenEvent
from .runtime import GenerationRuntime, TransformersRuntime

__all__ = ["GenerationWorker"]

log = logging.getLogger(__name__)


class _Running:
    """One job on this worker."""

    def __init__(self, delivery: Delivery, job: GenerateJob, prompt_tokens: int) -> None:
        self.delivery = delivery
        self.job = job
        self.key = f"{job.request_id}.{secrets.token_hex(3)}"
        self.attempt = secrets.token_hex(6)
        self.seq = 0
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.open = set(range(job.first_index, job.first_index + job.n))
        self.last_progress = time.monotonic()
        """When the queue last heard this job is alive (`in_progress`), not token progress."""
        self.settled = False
        self.pulled_at = time.time()
        self.first_token_at = self.last_token_at = 0.0
        self.trace = job_context(delivery.headers)


class _Model:
    def __init__(self, spec: ModelSpec, runtime: GenerationRuntime) -> None:
        self.spec = spec
        self.runtime = runtime
        self.source = None
        self.pull_task: asyncio.Task | None = None
        self.batch_source = None
        """The low-priority batch lane: admitted only into slots live work leaves free."""
        self.batch_pull_task: asyncio.Task | None = None
        self.stream_task: asyncio.Task | None = None
        self.room = asyncio.Event()
        self.events: asyncio.Queue[list[TokenEvent]] = asyncio.Queue()
        """Engine steps' tokens, in order, for one task to stream out in order."""


class GenerationWorker:
    def __init__(
        self,
        settings: Settings,
        bus: Bus,
        registry: LiveRegistry,
        runtimes: dict[str, GenerationRuntime] | None = None,
        payloads: PayloadStore | None = None,
    ) -> None:
        self.settings = settings
        self.bus = bus
        self.payloads = payloads or open_payload_store(settings, bus)
        self.registry = registry
        self.subjects = Subjects(settings.nats.subject_prefix)
        self.worker_id = f"gen-{secrets.token_hex(4)}"
        self.dead_letters = DeadLetters(bus, settings.nats, self.subjects)
        self._preset = runtimes or {}
        self._models: dict[str, _Model] = {}
        self._runtimes: list[GenerationRuntime] = []
        """Every runtime started or starting: a stop stops them all (a server that is
        still starting included)."""
        self._jobs: dict[str, _Running] = {}
        self._by_request: dict[str, list[str]] = {}
        self._state = "loading"
        self._stopping = False
        self._tasks: set[asyncio.Task] = set()
        self._cancelled = CancelledRequests(settings.gateway.request_timeout + 60)
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="shoal-gen-load")
        self._resolver = SourceResolver(f"{settings.data_dir}/cache", settings.s3)
        self.metrics = WorkerMetrics("generator")

    @property
    def state(self) -> str:
        return self._state

    def _serves(self, spec: ModelSpec) -> bool:
        served = self.settings.generator.models
        return "generate" in spec.tasks and ("*" in served or spec.id in served)

    def _make_runtime(self, spec: ModelSpec) -> GenerationRuntime:
        g = self.settings.generator
        slots = g.max_running or spec.profile.max_batch_items
        if spec.runtime == "sglang":
            from .sglang import SGLangRuntime

            return SGLangRuntime(spec, slots, g)
        return TransformersRuntime(
            spec, slots, g.device, self.settings.worker.max_adapters_per_model
        )

    # Lifecycle ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        heartbeat = asyncio.create_task(self._heartbeat())
        keepalive = asyncio.create_task(self._keepalive())
        try:
            await ensure_work_stream(self.bus, self.settings.nats, self.subjects)
            await self.bus.subscribe(self.subjects.cancel, self._on_cancel)
            for spec in [s for s in self.registry if self._serves(s)]:
                await self._start_model(spec)
            self._state = "ready"
            await self._send_heartbeat()
            log.info("generation worker %s ready: %s", self.worker_id, ", ".join(self._models))
            await stop.wait()
        finally:
            self._stopping = True
            for model in self._models.values():
                for task in (model.pull_task, model.batch_pull_task, model.stream_task):
                    if task is not None:
                        task.cancel()
            for running in list(self._jobs.values()):
                await self._settle(running, "nak")
            for model in self._models.values():
                for source in (model.source, model.batch_source):
                    if source is not None:
                        await source.close()
            await _stop_runtimes(self._runtimes)
            heartbeat.cancel()
            keepalive.cancel()
            self._state = "stopping"
            await self._send_heartbeat()
            self._loader.shutdown(wait=False, cancel_futures=True)

    async def _start_model(self, spec: ModelSpec) -> None:
        runtime = self._preset.get(spec.id) or self._make_runtime(spec)
        self._runtimes.append(runtime)
        model = _Model(spec, runtime)
        loop = asyncio.get_running_loop()

        def on_events(events: list[TokenEvent]) -> None:  # from the engine thread
            loop.call_soon_threadsafe(model.events.put_nowait, events)

        path = await loop.run_in_executor(self._loader, self._local_path, spec)
        await loop.run_in_executor(self._loader, runtime.start, path, on_events)
        nats = self.settings.nats
        consumer = await ensure_consumer(self.bus, nats, self.subjects, "interactive", spec.id)
        model.source = await self.bus.puller(nats.stream, consumer)
        batch_consumer = await ensure_consumer(self.bus, nats, self.subjects, "batch", spec.id)
        model.batch_source = await self.bus.puller(nats.stream, batch_consumer)
        self._models[spec.id] = model
        model.pull_task = asyncio.create_task(self._pull(model))
        model.batch_pull_task = asyncio.create_task(self._pull_batch_lane(model))
        model.stream_task = asyncio.create_task(self._stream_out(model))

    def _local_path(self, spec: ModelSpec) -> str:
        if spec.source.startswith("gguf:"):
            from .gguf import materialize_gguf

            return materialize_gguf(spec.source, self._resolver.cache_dir)
        return self._resolver.local(spec.source)

    # Pulling -------------------------------------------------------------------------------

    async def _pull(self, model: _Model) -> None:
        assert model.source is not None
        while not self._stopping:
            free = model.runtime.max_running - model.runtime.running
            if free <= 0:
                model.room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(model.room.wait(), 1.0)
                continue
            try:
                deliveries = await model.source.fetch(min(free, 16), max_wait=1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("fetch for %s failed: %r", model.spec.id, exc)
                await asyncio.sleep(0.5)
                continue
            for delivery in deliveries:
                await self._admit(model, delivery)

    async def _pull_batch_lane(self, model: _Model) -> None:
        """Batch-lane jobs take only slots beyond a quarter kept free for live requests,
        so a running batch job never makes a live one wait for a slot."""
        assert model.batch_source is not None
        runtime = model.runtime
        reserve = max(1, runtime.max_running // 4)
        while not self._stopping:
            free = runtime.max_running - runtime.running - reserve
            if free <= 0:
                await asyncio.sleep(0.05)
                continue
            try:
                deliveries = await model.batch_source.fetch(min(free, 8), max_wait=0.5)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("batch-lane fetch for %s failed: %r", model.spec.id, exc)
                await asyncio.sleep(0.5)
                continue
            for delivery in deliveries:
                await self._admit(model, delivery)

    async def _admit(self, model: _Model, delivery: Delivery) -> None:
        job = await read_job(
            self.payloads,
            self.dead_letters,
            delivery,
            self.settings.nats.max_deliver,
            self.worker_id,
        )
        if job is None:
            return
        if not isinstance(job, GenerateJob):
            message = "not a generation job"
            await refuse(self.dead_letters, delivery, "undecodable", message, self.worker_id)
            return
        if job.request_id in self._cancelled:  # its client left while it was queued
            with contextlib.suppress(Exception):
                await delivery.ack()
            return
        if job.deadline <= time.time():
            await self._reject(
                delivery,
                job,
                ErrorKind.DEADLINE_EXCEEDED,
                "the request's deadline passed before it ran",
                "ack",
            )
            return
        runtime = model.runtime
        try:
            ids = runtime.prompt_ids(job.messages, job.prompt)
        except Exception as exc:
            await self._reject(
                delivery,
                job,
                ErrorKind.INVALID_INPUT,
                f"the prompt cannot be tokenized: {exc}",
                "term",
            )
            return
        context = runtime.context
        max_new = job.sampling.max_tokens or context - len(ids)
        if not ids or len(ids) + max_new > context:
            await self._reject(
                delivery,
                job,
                ErrorKind.INVALID_INPUT,
                (
                    f"the prompt has {len(ids)} tokens; with max_tokens {max_new} that is "
                    f"more than the model's context of {context} tokens"
                ),
                "term",
            )
            return
        adapter_path = ""
        if job.adapter:
            try:
                spec = self.registry.resolve_adapter(model.spec.id, job.adapter)
                adapter_path = await asyncio.get_running_loop().run_in_executor(
                    self._loader, self._resolver.local, spec.source
                )
            except Exception as exc:
                await self._reject(
                    delivery,
                    job,
                    ErrorKind.NOT_FOUND,
                    f"adapter '{job.adapter}' cannot be used: {exc}",
                    "term",
                )
                return
        same = self._running_part(job)
        if same is not None:
            # A redelivery of a job still running here (its progress signal came late):
            # keep generating once, and settle through the newer delivery.
            same.delivery = delivery
            return
        running = _Running(delivery, job, len(ids))
        self._jobs[running.key] = running
        self._by_request.setdefault(job.request_id, []).append(running.key)
        if job.echo:
            await self._publish(running, [], prompt=job.prompt)
        runtime.submit(
            [
                SequenceRequest(
                    running.key,
                    job.first_index + i,
                    ids,
                    max_new,
                    job.sampling,
                    job.adapter,
                    adapter_path,
                )
                for i in range(job.n)
            ]
        )

    # Streaming back ----------------------------------------------------------------------------

    async def _stream_out(self, model: _Model) -> None:
        while True:
            events = await model.events.get()
            by_job: dict[str, list[TokenEvent]] = {}
            for event in events:
                by_job.setdefault(event.job, []).append(event)
            for key, job_events in by_job.items():
                running = self._jobs.get(key)
                if running is not None and not running.settled:
                    await self._forward(model, running, job_events)

    async def _forward(self, model: _Model, running: _Running, events: list[TokenEvent]) -> None:
        if any(e.error for e in events):
            await self._retry_or_fail(running, events[0].error)
            model.room.set()
            return
        deltas = []
        for e in events:
            logprobs = []
            if e.token is not None and e.logprob is not None:
                logprobs = [
                    TokenLogprob(token=e.token, logprob=e.logprob, bytes=e.token_bytes, top=e.top)
                ]
            running.completion_tokens += e.generated
            deltas.append(
                ChoiceDelta(index=e.choice, text=e.text, logprobs=logprobs, finish_reason=e.finish)
            )
            if e.finish:
                running.open.discard(e.choice)
        done = not running.open
        self._note_tokens(model, running, sum(e.generated for e in events))
        await self._publish(running, deltas, done=done)
        if done:
            await self._settle(running, "ack")
            model.room.set()
            if running.trace is not None:
                _record_spans(running, model.spec.id)

    def _note_tokens(self, model: _Model, running: _Running, generated: int) -> None:
        """Time to first token (from publish, as the client waits) and between tokens."""
        if not generated:
            return
        now = time.time()
        labels = {"model": model.spec.id}
        if not running.first_token_at:
            running.first_token_at = now
            self.metrics.ttft.record(now - running.delivery.published_at, labels)
        else:
            self.metrics.inter_token.record((now - running.last_token_at) / generated, labels)
        running.last_token_at = now
        self.metrics.generated(model.spec.id, generated)

    async def _publish(
        self, running: _Running, deltas: list[ChoiceDelta], done: bool = False, prompt: str = ""
    ) -> None:
        job = running.job
        chunk = GenerateChunk(
            request_id=job.request_id,
            part=job.part,
            attempt=running.attempt,
            seq=running.seq,
            deltas=deltas,
            done=done,
            prompt_tokens=running.prompt_tokens,
            completion_tokens=running.completion_tokens,
            prompt=prompt,
        )
        running.seq += 1
        try:
            await self.bus.publish(job.reply_to, encode(chunk))
        except Exception as exc:
            log.warning("chunk for %s not sent: %r", job.request_id, exc)

    # Settling --------------------------------------------------------------------------------

    async def _reject(
        self, delivery: Delivery, job: GenerateJob, kind: ErrorKind, message: str, settle: str
    ) -> None:
        # Chat jobs carry messages, completions a prompt: name the field the client sent.
        field = "messages" if job.messages else "prompt"
        param = field if kind is ErrorKind.INVALID_INPUT else ""
        failure = JobFailed(
            request_id=job.request_id, part=job.part, kind=kind, message=message, param=param
        )
        with contextlib.suppress(Exception):
            await self.bus.publish(job.reply_to, encode(failure))
        with contextlib.suppress(Exception):
            await (delivery.ack() if settle == "ack" else delivery.term())

    async def _retry_or_fail(self, running: _Running, error: str) -> None:
        log.error("generation for %s failed: %s", running.job.request_id, error)
        if running.delivery.num_delivered < self.settings.nats.max_deliver:
            await self._settle(running, "nak")
        else:
            running.settled = True
            self._forget(running)
            delivery = running.delivery
            await self.dead_letters.bury_delivery(
                delivery, reason="max_deliver", error=error, worker_id=self.worker_id
            )
            with contextlib.suppress(Exception):
                await delivery.term()

    async def _settle(self, running: _Running, how: str) -> None:
        if running.settled:
            return
        running.settled = True
        self._forget(running)
        with contextlib.suppress(Exception):
            if how == "ack":
                await running.delivery.ack()
            else:
                await running.delivery.nak(1.0 if not self._stopping else 0.0)

    def _forget(self, running: _Running) -> None:
        self._jobs.pop(running.key, None)
        keys = self._by_request.get(running.job.request_id, [])
        if running.key in keys:
            keys.remove(running.key)
        if not keys:
            self._by_request.pop(running.job.request_id, None)

    def _running_part(self, job: GenerateJob) -> _Running | None:
        for key in self._by_request.get(job.request_id, []):
            running = self._jobs.get(key)
            if running is not None and running.job.part == job.part:
                return running
        return None

    def _on_cancel(self, payload: bytes) -> None:
        request_id = payload.decode(errors="replace")
        self._cancelled.add(request_id)
        for key in list(self._by_request.get(request_id, [])):
            running = self._jobs.get(key)
            if running is None:
                continue
            model = self._models.get(running.job.model)
            if model is not None:
                model.runtime.cancel(key)
                model.room.set()
            task = asyncio.create_task(self._settle(running, "ack"))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # Background ----------------------------------------------------------------------------------

    async def _keepalive(self) -> None:
        every = max(0.2, self.settings.nats.ack_wait / 3)
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for running in list(self._jobs.values()):
                if now - running.last_progress >= every:
                    running.last_progress = now
                    with contextlib.suppress(Exception):
                        await running.delivery.in_progress()

    async def _heartbeat(self) -> None:
        while True:
            await self._send_heartbeat()
            await asyncio.sleep(self.settings.worker.heartbeat_interval)

    async def _send_heartbeat(self) -> None:
        beat = WorkerHeartbeat(
            worker_id=self.worker_id,
            models=sorted(self._models),
            state=self._state,  # type: ignore[arg-type]
            sent_at=time.time(),
            resident=sorted(self._models),
            batch_max=max((m.runtime.max_batch for m in self._models.values()), default=0),
            active=sum(m.runtime.running for m in self._models.values()),
            **self.metrics.rates(),  # tokens/s; it runs no encoder batches
        )
        with contextlib.suppress(Exception):
            await self.bus.publish(self.subjects.heartbeat, encode(beat))


async def _stop_runtimes(runtimes: list[GenerationRuntime], within: float = 3.0) -> None:
    """Stop every runtime at once, each on a thread of its own (the loader thread may be
    busy starting one of them), waiting `within` seconds at most."""
    stops = [asyncio.ensure_future(asyncio.to_thread(r.stop)) for r in runtimes]
    if stops:
        done, late = await asyncio.wait(stops, timeout=within)
        if late:
            log.warning("%d runtime(s) did not stop within %.0fs", len(late), within)
        for task in done:
            if task.exception() is not None:
                log.warning("stopping a runtime failed: %r", task.exception())


def _record_spans(running: _Running, model: str) -> None:
    assert running.trace is not None
    job = running.job
    attributes = {"shoal.model": model, "shoal.op": "generate", "shoal.request_id": job.request_id}
    decode = {"shoal.completion_tokens": running.completion_tokens}
    record_job_spans(
        running.trace,
        running.delivery.published_at,
        running.pulled_at,
        running.last_token_at,
        attributes,
        [
            ("shoal.generate.first_token", running.pulled_at, running.first_token_at, {}),
            ("shoal.generate.decode", running.first_token_at, running.last_token_at, decode),
        ],
    )
