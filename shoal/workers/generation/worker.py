"""The generation worker: generation jobs into a runtime's free slots, tokens streamed back.

Delivery is the worker core's (shoal/workers/core/). This kind adds: for each served
model a runtime (the in-process engine, or a supervised SGLang server), loaded when the
model is added; room is the runtime's free slots (batch-lane jobs leave free one slot more
than the most live sequences run at once in the last `LiveDemand.window` seconds, at most
a quarter of the slots: a batch job alone takes all but one slot, and live traffic finds
its slots free as it grows); each admitted job becomes its `n` sequences, and the
runtime's tokens go to the job's reply subject as `GenerateChunk`s, one per engine step
per job (a batch-lane job's at most once per `BATCH_FLUSH_S`), numbered within
this attempt. A job is ANSWERED when every choice has finished; a prompt that does not
fit is INVALID, an unusable adapter NOT_FOUND, a runtime failure FAILED (the job is
regenerated elsewhere, under the same seed); a cancel stops its sequences and frees their
slots.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from ...config import Settings
from ...model_registry import LiveRegistry, ModelSpec, SourceResolver
from ...queue import Bus, Delivery
from ...queue.messages import ChoiceDelta, GenerateChunk, GenerateJob, Job, TokenLogprob, encode
from ...queue.payloads import PayloadStore
from ..core import Held, Outcome, Worker, WorkerKind
from ..observe import WorkerMetrics
from ..tokens import answer_asked
from .engine import SequenceRequest, TokenEvent
from .held import GenerationHeld, LiveDemand, record_spans
from .runtime import GenerationRuntime, TransformersRuntime, stop_runtimes

__all__ = ["GenerationKind", "GenerationWorker"]

log = logging.getLogger(__name__)

BATCH_FLUSH_S = 1.0
"""A batch-lane job's tokens go out together at most this often (and when it finishes):
nobody watches a batch line's text arrive, and one message per engine step per sequence
(~360/s at 32 sequences here) costs the gateway and NATS CPU on the cores the engine runs
on."""


class _Model:
    def __init__(self, spec: ModelSpec, runtime: GenerationRuntime) -> None:
        self.spec = spec
        self.runtime = runtime
        self.live = LiveDemand(runtime.max_running // 4)
        self.events: asyncio.Queue[list[TokenEvent]] = asyncio.Queue()
        """Engine steps' tokens, in order, for one task to stream out in order."""
        self.streaming: asyncio.Task | None = None


class GenerationWorker(Worker):
    """A worker core running the generation kind (`shoal worker --kind generate`)."""

    def __init__(
        self,
        settings: Settings,
        bus: Bus,
        registry: LiveRegistry,
        runtimes: dict[str, GenerationRuntime] | None = None,
        payloads: PayloadStore | None = None,
    ) -> None:
        """`runtimes` preset the runtime of some models (tests)."""
        super().__init__(
            settings, bus, registry, GenerationKind(settings, runtimes), None, payloads
        )


class GenerationKind(WorkerKind):
    """Generation models, each behind a `GenerationRuntime`."""

    name = "gen"

    def __init__(self, settings: Settings, runtimes: dict[str, GenerationRuntime] | None = None):
        self.settings = settings
        self._preset = runtimes or {}
        self.models: dict[str, _Model] = {}
        self._runtimes: list[GenerationRuntime] = []
        """Every runtime started or starting: a stop stops them all (a server that is
        still starting included)."""
        self._jobs: dict[str, GenerationHeld] = {}
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="shoal-gen-load")
        self._resolver = SourceResolver.of(settings)
        self.metrics = WorkerMetrics("generator")

    # The models ------------------------------------------------------------------------

    def serves(self, spec: ModelSpec) -> bool:
        return self.settings.generator.serves(spec.id, spec.tasks)

    def _make_runtime(self, spec: ModelSpec, engine: str) -> GenerationRuntime:
        g = self.settings.generator
        slots = g.max_running or spec.profile.max_batch_items
        loras = self.settings.worker.max_adapters_per_model
        if spec.runtime == "sglang":
            from .sglang import SGLangRuntime

            return SGLangRuntime(spec, slots, g)
        if engine == "openvino":
            from .openvino import OpenVINORuntime

            threads = spec.profile.threads or self.settings.worker.threads
            return OpenVINORuntime(spec, slots, g, self.settings.cache_path, threads, loras)
        return TransformersRuntime(spec, slots, g.device, loras)

    def _engine(self, spec: ModelSpec) -> str:
        """`openvino` on a CPU unless the profile says `torch` (or OpenVINO GenAI is not
        installed: then `auto` is torch); a GPU runs torch (SGLang is its runtime)."""
        from ..adapters.sentence_transformers import pick_device

        if spec.profile.engine == "torch" or pick_device(self.settings.generator.device) != "cpu":
            return "torch"
        if spec.profile.engine == "auto" and importlib.util.find_spec("openvino_genai") is None:
            log.warning(
                "%s: openvino-genai is not installed; the transformers engine runs it", spec.id
            )
            return "torch"
        return "openvino"

    async def add_model(self, spec: ModelSpec) -> None:
        """Load the model now: a generation worker is ready once its runtimes are. A model
        that fails to load leaves no runtime behind: the registry follow tries it again,
        and each try kept one more runtime (a started engine process, say) before."""
        engine = self._engine(spec)
        model = _Model(spec, self._preset.get(spec.id) or self._make_runtime(spec, engine))
        self._runtimes.append(model.runtime)
        try:
            await self._load(model, engine)
        except BaseException:
            await self._drop(model.runtime)
            raise
        model.streaming = asyncio.create_task(self._stream_out(model))
        self.models[spec.id] = model

    async def _load(self, model: _Model, engine: str) -> None:
        spec, loop = model.spec, asyncio.get_running_loop()

        def on_events(events: list[TokenEvent]) -> None:  # from the engine thread
            loop.call_soon_threadsafe(model.events.put_nowait, events)

        path = await loop.run_in_executor(self._loader, self._local_path, spec)
        try:
            await loop.run_in_executor(self._loader, model.runtime.start, path, on_events)
        except Exception as exc:
            if spec.id in self._preset or engine != "openvino" or spec.profile.engine != "auto":
                raise
            # The default engine could not start here (no export tool, say): the model is
            # still served, by the transformers engine, and the log says why.
            log.warning(
                "%s: the OpenVINO runtime failed (%s); the transformers engine runs it",
                spec.id,
                exc,
            )
            await self._drop(model.runtime)
            model.runtime = self._make_runtime(spec, "torch")
            self._runtimes.append(model.runtime)
            await loop.run_in_executor(self._loader, model.runtime.start, path, on_events)

    def _local_path(self, spec: ModelSpec) -> str:
        registered = not self.core.registry.is_builtin(spec.id)
        if spec.source.startswith("gguf:"):
            from .gguf import materialize_gguf

            # a registered file must lie under the model roots
            self._resolver.check(spec.source, registered=registered)
            return materialize_gguf(spec.source, self._resolver.cache_dir)
        return self._resolver.local(spec.source, registered=registered)

    async def remove_model(self, model: str) -> None:
        served = self.models.pop(model)
        if served.streaming is not None:
            served.streaming.cancel()
        await self._drop(served.runtime)

    async def _drop(self, runtime: GenerationRuntime) -> None:
        """Forget one runtime and stop it (a model removed, or one that failed to load)."""
        self._runtimes.remove(runtime)
        await stop_runtimes([runtime])

    async def stop(self) -> None:
        for model in self.models.values():
            if model.streaming is not None:
                model.streaming.cancel()
        await stop_runtimes(self._runtimes)
        self._loader.shutdown(wait=False, cancel_futures=True)

    def heartbeat(self) -> dict[str, Any]:
        runtimes = [m.runtime for m in self.models.values()]
        return {
            "resident": sorted(self.models),
            "batch_max": max((r.max_batch for r in runtimes), default=0),
            "active": sum(r.running for r in runtimes),
            "engines": {m.spec.id: m.runtime.engine_name for m in self.models.values()},
            "sequences_drafted": sum(r.drafted for r in runtimes),
            "drafted_moved": sum(r.drafted_moved for r in runtimes),
            **self.metrics.rates(),  # tokens/s; it runs no encoder batches
        }

    # Room and admission --------------------------------------------------------------

    def room(self, model: str, batch_lane: bool) -> int:
        served = self.models.get(model)
        if served is None:
            return 0
        runtime = served.runtime
        free = runtime.max_running - runtime.running
        served.live.note(self._live_sequences(model))
        if batch_lane:
            return min(free - served.live.spare(), 8)
        return min(free, 16)

    def _live_sequences(self, model: str) -> int:
        return sum(
            len(r.open) for r in self._jobs.values() if not r.batch_lane and r.job.model == model
        )

    def hold(self, delivery: Delivery, job: Job, batch_lane: bool) -> Held:
        return GenerationHeld(delivery, job, batch_lane)

    async def accept(self, model: str, jobs: list[Held], batch_lane: bool) -> None:
        served = self.models[model]
        jobs = await answer_asked(self.core, jobs, served.runtime.tokens)
        for running in jobs:
            await self._start(served, running)  # type: ignore[arg-type]
        if not batch_lane:
            served.live.note(self._live_sequences(model))

    async def _start(self, model: _Model, running: GenerationHeld) -> None:
        job: GenerateJob = running.job  # type: ignore[assignment]
        # Chat jobs carry messages, completions a prompt: name the field the client sent.
        field = "messages" if job.messages else "prompt"
        runtime = model.runtime
        try:
            ids = runtime.prompt_ids(job.messages, job.prompt)
        except Exception as exc:
            message = f"the prompt cannot be tokenized: {exc}"
            await self.core.settle(running, Outcome.INVALID, message, param=field)
            return
        context = runtime.context
        max_new = job.sampling.max_tokens or context - len(ids)
        if not ids or len(ids) + max_new > context:
            message = (
                f"the prompt has {len(ids)} tokens; with max_tokens {max_new} that is more "
                f"than the model's context of {context} tokens"
            )
            await self.core.settle(running, Outcome.INVALID, message, param=field)
            return
        adapter_path = ""
        if job.adapter:
            try:
                spec = self.core.registry.resolve_adapter(model.spec.id, job.adapter)
                fetch = partial(self._resolver.local, spec.source, registered=True)
                adapter_path = await asyncio.get_running_loop().run_in_executor(self._loader, fetch)
            except Exception as exc:
                message = f"adapter '{job.adapter}' cannot be used: {exc}"
                await self.core.settle(running, Outcome.NOT_FOUND, message, param="")
                return
        same = self._running_part(job)
        if same is not None:
            # A redelivery of a job still running here (its progress signal came late):
            # keep generating once, and settle through the newer delivery.
            same.delivery = running.delivery
            self.core.release(running)
            running.settled = True
            return
        running.prompt_tokens = len(ids)
        self._jobs[running.key] = running
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

    def _running_part(self, job: GenerateJob) -> GenerationHeld | None:
        for running in self._jobs.values():
            if running.job.request_id == job.request_id and running.job.part == job.part:
                return running
        return None

    def drop(self, jobs: list[Held]) -> None:
        for running in jobs:
            key = running.key  # type: ignore[attr-defined]
            model = self.models.get(running.job.model)
            if model is not None:
                model.runtime.cancel(key)
            self._jobs.pop(key, None)
        self.core.signal_room()

    # Streaming back ----------------------------------------------------------------------

    async def _stream_out(self, model: _Model) -> None:
        while True:
            events = await model.events.get()
            by_job: dict[str, list[TokenEvent]] = {}
            for event in events:
                by_job.setdefault(event.job, []).append(event)
            for key, job_events in by_job.items():
                running = self._jobs.get(key)
                if running is not None and not running.done:
                    await self._send(model, running, job_events)

    async def _send(self, model: _Model, running: GenerationHeld, events: list[TokenEvent]) -> None:
        error = next((e.error for e in events if e.error), "")
        if error:
            self._jobs.pop(running.key, None)
            await self.core.settle(running, Outcome.FAILED, f"generation failed: {error}")
            return
        # One delta per choice per step: a speculative step brings several tokens of one
        # choice, and a client reads a chunk's choice once (OpenAI never repeats an index).
        texts: dict[int, list[str]] = {}
        logprobs: dict[int, list[TokenLogprob]] = {}
        finish: dict[int, str] = {}
        for e in events:
            texts.setdefault(e.choice, []).append(e.text)
            chosen = logprobs.setdefault(e.choice, [])
            if e.token is not None and e.logprob is not None:
                chosen.append(
                    TokenLogprob(token=e.token, logprob=e.logprob, bytes=e.token_bytes, top=e.top)
                )
            running.completion_tokens += e.generated
            if e.finish:
                finish[e.choice] = e.finish
                running.open.discard(e.choice)
        deltas = [
            ChoiceDelta(
                index=i, text="".join(t), logprobs=logprobs[i], finish_reason=finish.get(i, "")
            )
            for i, t in texts.items()
        ]
        done = not running.open
        self._note_tokens(model, running, sum(e.generated for e in events))
        if running.batch_lane:
            running.pending += deltas
            now = time.monotonic()
            if not done and now - running.flushed_at < BATCH_FLUSH_S:
                return
            deltas, running.pending, running.flushed_at = running.pending, [], now
        await self._publish(running, deltas, done=done)
        if done:
            self._jobs.pop(running.key, None)
            await self.core.settle(running, Outcome.ANSWERED)
            if running.trace is not None:
                record_spans(running, model.spec.id)

    def _note_tokens(self, model: _Model, running: GenerationHeld, generated: int) -> None:
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
        self,
        running: GenerationHeld,
        deltas: list[ChoiceDelta],
        done: bool = False,
        prompt: str = "",
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
        await self.core.publish(running, encode(chunk))
