"""The OpenVINO runtime: OpenVINO GenAI's continuous-batching pipeline on the CPU.

OpenVINO GenAI (`openvino-genai`, a prebuilt wheel of the OpenVINO the encoders already
use) runs a causal LM with a paged KV cache, continuous batching, prefix caching and its
own sampler, in C++. This runtime owns one `ContinuousBatchingPipeline` per model, stepped
in a process of its own (openvino_host.py: a step holds the GIL throughout): between steps
that process adds the sequences submitted since the last step (`add_request` with token
ids: Shoal applies the chat template itself, so prompts and usage are the same as on
every runtime) and cancels those whose request went away; after each step this side reads
every sequence's new token ids and turns them into text with Shoal's own incremental
detokenizer (which also cuts at stop strings, exactly where OpenAI does, never emitting
them). If that process dies, what it held fails back to the queue (to be generated again
under the same seeds, here or elsewhere), as does one sent before its death was noticed,
and a new one starts; requests that come meanwhile wait for it.

What maps to GenAI (checked against openvino-genai 2026.4.1): greedy or sampled
(`temperature`, `top_p`) with a per-sequence `rng_seed` (seed + choice, so a redelivered
job regenerates the same text, whatever else shares the batch), `presence_penalty` and
`frequency_penalty` (OpenAI's formula), `max_tokens`, the chosen token's logprob,
structured output (a JSON schema, xgrammar), cancel (the sequence leaves the batch and
frees its KV blocks at the next step). What GenAI cannot do per request in this loop,
LoRA adapters and `top_logprobs`, runs on the transformers engine beside it (runtime.py),
loaded the first time such a request comes.

Precision: the weights are the checkpoint's own by default (a GGUF's 4-bit blocks),
guarded against the float32 model of the same checkpoint; precision.py says which tiers
there are and how each is checked. `dtype = "float32"` (the default) computes in float32
with an f32 KV cache: with float32 weights (`weights = "float32"`) greedy answers equal
transformers' float32 token for token (tested). `dtype = "bfloat16"` asks for OpenVINO's
own default on a CPU with native bf16, faster and not exact. LoRA and `top_logprobs`
requests go to the transformers engine, which serves the float32 weights.

Speculative decoding (`generator.openvino_draft_tokens`, 4 by default): where float32 or
16-bit weights serve, a greedy sequence that runs alone is decoded by a second pipeline in
the same process, where the model's int8 export drafts tokens and the served model checks
them (openvino_host.py says how, and how the sequence moves to the main batch once
another arrives; one stream's gain is in perf/results/README.md). A GGUF's blocks and int8
weights read no more bytes than that draft, so they are not drafted.

The IR is exported once (openvino_export.py) and cached in the cache dir.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

from ...config import GeneratorSettings
from ...model_registry import ModelSpec
from .engine import SequenceRequest, TokenEvent
from .openvino_export import export_command, openvino_ir
from .openvino_host import host
from .openvino_protocol import (
    Add,
    Cancel,
    Failed,
    Notice,
    Ready,
    Refused,
    SequenceStep,
    Stepped,
    Stop,
    ToHost,
    receive_from_host,
    send,
)
from .openvino_requests import generation_fields, may_assist, needs_torch, request_id
from .precision import served_weights
from .runtime import GenerationRuntime, TransformersRuntime
from .text import TextTracker
from .torch_fallback import TorchFallback

__all__ = ["OpenVINORuntime"]

log = logging.getLogger(__name__)

_KV_BLOCK = 32  # tokens per KV-cache block of GenAI's CPU paged attention
_RESTARTS = 3  # a pipeline process that dies more often than this ...
_RESTART_WINDOW_S = 600.0  # ... within this is not restarted again


class _Sequence:
    """One sequence in the pipeline: its request, its text and how far it got."""

    __slots__ = ("finished", "generated", "req", "rid", "tracker")

    def __init__(self, req: SequenceRequest, rid: int, tracker: TextTracker) -> None:
        self.req = req
        self.rid = rid
        self.tracker = tracker
        self.generated = 0
        self.finished = False


class OpenVINORuntime(GenerationRuntime):
    """One OpenVINO GenAI continuous-batching pipeline for one model, stepped in a process
    of its own (openvino_host.py says why); requests it cannot serve go to a transformers
    engine beside it."""

    def __init__(
        self,
        spec: ModelSpec,
        max_running: int,
        settings: GeneratorSettings,
        cache_dir: Path,
        threads: int = 0,
        max_loras: int = 8,
    ) -> None:
        super().__init__(spec, max_running)
        self._settings = settings
        self._cache_dir = cache_dir
        self._threads = threads or os.cpu_count() or 1
        self._lock = threading.Lock()  # the pipe's sending end and `_active`
        self._active: dict[int, _Sequence] = {}
        self._conn: Connection | _Closed | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._reader: threading.Thread | None = None
        self._stopping = False
        self._max_batch = 0
        self._weights: str | None = None  # what serves beside float32, how close it measured
        self._assisted = False  # a lone greedy sequence is decoded speculatively
        self._host_args: tuple = ()
        self._backlog: list[ToHost] | None = None
        """While the pipeline's process restarts: what to send it once it is up."""
        self._restarts: deque[float] = deque(maxlen=_RESTARTS)
        self._fallback = TorchFallback(
            lambda: TransformersRuntime(spec, max_running, "cpu", max_loras)
        )

    # Lifecycle --------------------------------------------------------------------------

    def start(self, path: str, on_events: Callable[[list[TokenEvent]], None]) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self._on_events = on_events
        self._fallback.path, self._fallback.on_events = path, on_events
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        config = AutoConfig.from_pretrained(path)
        limit = getattr(config, "max_position_embeddings", None) or self.spec.max_length
        self._context = min(self.spec.max_length, limit)
        eos = getattr(config, "eos_token_id", None)
        eos = eos if eos is not None else self.tokenizer.eos_token_id
        self._eos = set(eos if isinstance(eos, list) else [eos])
        scheduler = {
            "cache_size": max(1, round(self._settings.openvino_cache_gb)),
            "max_num_seqs": self.max_running,
            "dynamic_split_fuse": True,
            "enable_prefix_caching": True,
        }
        properties: dict[str, object] = {"INFERENCE_NUM_THREADS": self._threads}
        if self.spec.profile.dtype == "float32":
            properties |= {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
        weights = served_weights(
            self.spec, path, self._cache_dir, self._settings, self.tokenizer, properties
        )
        self._weights = weights.label
        # A draft only pays where the served weights are much wider than its int8. It
        # compiles without the served weights' own properties (the native tier turns
        # dynamic quantization off for exactness; the served model checks the draft).
        assist = self._assist(path, dict(properties)) if weights.drafted else None
        properties |= weights.properties
        self._host_args = (str(weights.ir), scheduler, properties, assist)
        self._spawn()
        log.info(
            "OpenVINO runtime for %s: %d threads, %s, up to %d sequences, in process %d",
            self.spec.id,
            self._threads,
            self.engine_name.removeprefix("openvino "),
            self.max_running,
            self._process.pid,
        )
        self._reader = threading.Thread(target=self._read, name="shoal-openvino", daemon=True)
        self._reader.start()

    def _spawn(self) -> None:
        """Start the pipeline's process, wait until it has loaded, then send it what came
        meanwhile (a restart's backlog).

        Raises:
            RuntimeError: it could not load.
        """
        # spawn, not fork: the worker has threads and an event loop a fork would copy.
        context = multiprocessing.get_context("spawn")
        conn, theirs = context.Pipe()
        process = context.Process(
            target=host, args=(theirs, *self._host_args), daemon=True,
            name=f"shoal-openvino-{self.spec.id}",
        )  # fmt: skip
        with self._lock:  # `stop` either sees this process (and kills it) or ran before
            if self._stopping:
                raise RuntimeError("stopping")
            self._process = process
        process.start()
        theirs.close()
        try:
            while isinstance(answer := receive_from_host(conn), Notice):
                log.warning("%s: %s", self.spec.id, answer.message)
        except EOFError:
            answer = Failed(f"the OpenVINO process exited ({process.exitcode})")
        if not isinstance(answer, Ready):
            process.join(timeout=5)
            why = answer.message if isinstance(answer, Failed) else repr(answer)
            raise RuntimeError(f"OpenVINO could not load {self.spec.id}: {why}")
        self._assisted = answer.assisted
        with self._lock:
            if self._stopping:
                process.kill()
                raise RuntimeError("stopping")
            self._conn = conn
            backlog, self._backlog = self._backlog or [], None
            for message in backlog:
                # An add whose sequence was failed meanwhile would only hold a slot.
                if not isinstance(message, Add) or message.rid in self._active:
                    send(conn, message)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            process, restarting = self._process, self._backlog is not None
        if process is not None and process.is_alive():
            if not restarting:  # it can stop cleanly
                self._send(Stop())
                process.join(timeout=3)
            if process.is_alive():
                process.kill()
        if self._reader is not None:
            self._reader.join(timeout=2)
        self._fallback.stop()

    @property
    def context(self) -> int:
        return self._context

    def submit(self, requests: list[SequenceRequest]) -> None:
        mine = [r for r in requests if not needs_torch(r)]
        if len(mine) < len(requests):
            self._fallback.submit([r for r in requests if needs_torch(r)])
        for req in mine:
            rid = request_id(req)
            seq = _Sequence(req, rid, TextTracker(self._decode, list(req.sampling.stop)))
            with self._lock:
                self._active[rid] = seq
            alone = len(mine) == 1 and may_assist(req)  # a job of n choices never drafts
            if not self._send(Add(rid, req.prompt_ids, generation_fields(req), alone)):
                self._fail([seq], "the OpenVINO process is gone")

    def cancel(self, job: str) -> None:
        with self._lock:
            gone = [s for s in self._active.values() if s.req.job == job]
            for seq in gone:
                del self._active[seq.rid]
        for seq in gone:
            self._send(Cancel(seq.rid))
        self._fallback.cancel(job)

    @property
    def running(self) -> int:
        return len(self._active) + self._fallback.running

    @property
    def max_batch(self) -> int:
        return max(self._max_batch, self._fallback.max_batch)

    @property
    def engine_name(self) -> str:
        precision = "float32" if self.spec.profile.dtype == "float32" else "the CPU's fastest"
        said = [self._weights] if self._weights is not None else []
        if self._assisted:
            said.append("int8 draft when alone")
        return ", ".join([f"openvino {precision}", *said])

    def _assist(self, path: str, properties: dict[str, object]) -> dict[str, object] | None:
        """The lone-sequence speculative pipeline's arguments (openvino_host.py says
        how it runs), or None: switched off, or no int8 draft could be exported."""
        tokens = self._settings.openvino_draft_tokens
        if tokens <= 0:
            return None
        try:
            draft = openvino_ir(path, self._cache_dir, export_command(self._settings), "int8")
        except Exception as exc:
            log.warning("%s: no int8 draft (%s): no speculative decoding", self.spec.id, exc)
            return None
        # One sequence at a time, so a small cache: the context, for the model and draft.
        blocks = 2 * -(-self._context // _KV_BLOCK) + 8
        scheduler = {"num_kv_blocks": blocks, "cache_size": 0, "max_num_seqs": 2,
                     "dynamic_split_fuse": True, "enable_prefix_caching": True}  # fmt: skip
        return {
            "draft": str(draft),
            "scheduler": scheduler,
            "tokens": tokens,
            "properties": properties,
        }

    # Talking to the pipeline's process ------------------------------------------------------

    def _send(self, message: ToHost) -> bool:
        """Whether `message` reached the pipe (False once the process is gone)."""
        assert self._conn is not None
        try:
            with self._lock:
                if self._backlog is not None:
                    self._backlog.append(message)
                else:
                    send(self._conn, message)
        except (OSError, ValueError):
            return False
        return True

    def _read(self) -> None:
        """The reader thread: turns each step's token ids into events (it blocks in
        `recv`, holding no GIL, while the pipeline steps), and restarts the pipeline's
        process if it dies."""
        while True:
            assert self._conn is not None
            try:
                message = receive_from_host(self._conn)
            except (EOFError, OSError):
                if self._stopping or not self._restarted():
                    return
                continue
            if isinstance(message, Stepped):
                self._max_batch = max(self._max_batch, len(message.sequences))
                self.drafted += message.drafted
                self.drafted_moved += message.moved
                self._collect(message.sequences)
            elif isinstance(message, Refused):
                log.error("OpenVINO refused a request: %s", message.message)
                seq = self._active.get(message.rid)
                if seq is not None:
                    self._fail([seq], message.message)
            elif isinstance(message, Failed):  # a step failed: it dropped every sequence
                log.error("OpenVINO generation step failed: %s", message.message)
                self._fail(list(self._active.values()), message.message)
            else:
                log.error("unexpected from the OpenVINO process: %r", message)

    def _restarted(self) -> bool:
        """After the pipeline's process died (killed, out of memory, a crash in OpenVINO):
        fail what it held (the worker returns those jobs to the queue, to be generated
        again under their seeds), hold what is submitted meanwhile, start a new one.
        False when it died too often (`_RESTARTS` within `_RESTART_WINDOW_S`) or could
        not load again: then every request on this model fails (back to the queue, for
        other workers, until its deliveries run out) until this worker restarts."""
        with self._lock:
            self._backlog = []  # from here, sends wait for the new process
            lost = list(self._active.values())
        exitcode = self._process.exitcode if self._process is not None else None
        log.error("the OpenVINO process of %s exited (%s)", self.spec.id, exitcode)
        self._fail(lost, "the OpenVINO process exited")
        now = time.monotonic()
        if len(self._restarts) == _RESTARTS and now - self._restarts[0] < _RESTART_WINDOW_S:
            log.error("not restarting it: %d restarts within %.0f s", _RESTARTS, _RESTART_WINDOW_S)
        else:
            self._restarts.append(now)
            try:
                self._spawn()
            except Exception:  # not loading again, or no process at all (ENOMEM, EMFILE)
                if self._stopping:  # `stop` came while it loaded
                    return False
                log.exception("the OpenVINO process of %s could not restart", self.spec.id)
            else:
                log.warning("the OpenVINO process of %s restarted", self.spec.id)
                return True
        with self._lock:
            backlog, self._backlog = self._backlog or [], None
            self._conn = _Closed()  # later sends fail at once
            lost = [
                self._active[m.rid] for m in backlog if isinstance(m, Add) and m.rid in self._active
            ]
        self._fail(lost, "the OpenVINO process is gone")
        return False

    def _fail(self, seqs: list[_Sequence], error: str) -> None:
        with self._lock:
            for seq in seqs:
                self._active.pop(seq.rid, None)
        self._on_events([TokenEvent(s.req.job, s.req.choice, error=error) for s in seqs])

    def _collect(self, results: list[SequenceStep]) -> None:
        events: list[TokenEvent] = []
        for step in results:
            rid, tokens, logprobs, state = step.rid, step.tokens, step.logprobs, step.state
            seq = self._active.get(rid)
            if seq is None:  # cancelled meanwhile
                continue
            for k, token in enumerate(tokens):
                if seq.finished:
                    break
                events.append(self._advance(seq, token, logprobs[k] if k < len(logprobs) else None))
            if not seq.finished and state == "ignored":
                seq.finished = True
                events.append(
                    TokenEvent(seq.req.job, seq.req.choice, error="the pipeline ignored it")
                )
            elif not seq.finished and state == "done":
                reason = "length" if seq.generated >= seq.req.max_new else "stop"
                events.append(self._finish(seq, reason))
            if seq.finished:
                with self._lock:
                    self._active.pop(rid, None)
                if state == "running":  # a stop string: the rest is not wanted
                    self._send(Cancel(rid))
        if events:
            self._on_events(events)

    def _advance(self, seq: _Sequence, token: int, logprob: float | None) -> TokenEvent:
        req = seq.req
        if token in self._eos:
            return self._finish(seq, "stop")
        seq.generated += 1
        event = TokenEvent(req.job, req.choice, generated=1)
        event.text = seq.tracker.add(token)
        if req.sampling.logprobs and logprob is not None:
            text = self.tokenizer.decode([token])
            event.token, event.token_bytes, event.logprob = text, list(text.encode()), logprob
        if seq.tracker.stopped:
            event.finish = "stop"
            seq.finished = True
        elif seq.generated >= req.max_new:
            event.text += seq.tracker.finish()
            event.finish = "length"
            seq.finished = True
        return event

    def _finish(self, seq: _Sequence, reason: str) -> TokenEvent:
        seq.finished = True
        text = "" if seq.tracker.stopped else seq.tracker.finish()
        return TokenEvent(seq.req.job, seq.req.choice, text=text, finish=reason)

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class _Closed:
    """The pipe of a pipeline process that is gone for good."""

    def send_bytes(self, data: bytes) -> None:
        raise OSError("the OpenVINO process is gone")

    def recv_bytes(self) -> bytes:
        raise EOFError
