"""The OpenVINO runtime: OpenVINO GenAI's continuous-batching pipeline on the CPU.

OpenVINO GenAI (`openvino-genai`, a prebuilt wheel of the OpenVINO the encoders already
use) runs a causal LM with a paged KV cache, continuous batching, prefix caching and its
own sampler, in C++. This runtime owns one `ContinuousBatchingPipeline` per model on one
engine thread: between steps it adds the sequences submitted since the last step
(`add_request` with token ids: Shoal applies the chat template itself, so prompts and
usage are the same as on every runtime) and cancels those whose request went away;
after each step it reads every sequence's new token ids and turns them into text with
Shoal's own incremental detokenizer (which also cuts at stop strings, exactly where
OpenAI does, never emitting them).

What maps to GenAI (checked against openvino-genai 2026.4.1): greedy or sampled
(`temperature`, `top_p`) with a per-sequence `rng_seed` (seed + choice, so a redelivered
job regenerates the same text, whatever else shares the batch), `presence_penalty` and
`frequency_penalty` (OpenAI's formula), `max_tokens`, the chosen token's logprob,
structured output (a JSON schema, xgrammar), cancel (the sequence leaves the batch and
frees its KV blocks at the next step). What GenAI cannot do per request in this loop,
LoRA adapters and `top_logprobs`, runs on the transformers engine beside it (runtime.py),
loaded the first time such a request comes.

Precision: `dtype = "float32"` (the default) compiles with f32 inference precision and
an f32 KV cache: greedy answers equal transformers' float32 token for token (tested).
OpenVINO's own default on a CPU with native bf16 is bf16, which is faster and not
exact; `dtype = "bfloat16"` asks for it.

The model's OpenVINO IR is made once from the model's transformers directory by
`optimum-cli export openvino` (optimum-intel), which pins a transformers older than
Shoal's, so it runs from its own environment (`generator.openvino_export_command`, by
default the `.venv-export` that `make setup` builds beside `.venv`), and is cached in
the data dir.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from ...config import GeneratorSettings
from ...lifecycle import die_with_parent
from ...model_registry import ModelSpec
from .engine import SequenceRequest, TokenEvent
from .runtime import GenerationRuntime, TransformersRuntime
from .text import TextTracker

__all__ = ["OpenVINORuntime", "export_command", "openvino_ir"]

log = logging.getLogger(__name__)

_EXPORT_TIMEOUT = 3600.0
_SMALLEST_TOP_P = 1e-30  # a normal float32, far below any top_p that keeps two tokens


def export_command(settings: GeneratorSettings) -> list[str]:
    """How to run `optimum-cli`: the settings' command, else one beside this Python,
    else the `.venv-export` beside this venv (what `make setup` builds).

    Raises:
        RuntimeError: none is installed.
    """
    if settings.openvino_export_command:
        return list(settings.openvino_export_command)
    here = Path(sys.executable).parent / "optimum-cli"
    beside = Path(sys.prefix).parent / ".venv-export" / "bin" / "optimum-cli"
    for candidate in (here, beside):
        if candidate.exists():
            return [str(candidate)]
    raise RuntimeError(
        "the OpenVINO runtime needs optimum-cli to export the model once: run `make setup` "
        "(it builds .venv-export), or set generator.openvino_export_command"
    )


def openvino_ir(source: str, cache_dir: Path, command: Sequence[str]) -> Path:
    """The OpenVINO IR of the transformers model directory `source`: exported on first
    use (float32 weights), then read from the cache. Safe against a crash mid-export (a
    copy is used only once complete) and against two workers exporting at once."""
    src = Path(source)
    stamp = [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(src.iterdir())]
    key = hashlib.sha256(f"{src.resolve()}|{'|'.join(stamp)}".encode()).hexdigest()[:20]
    target = cache_dir / "openvino" / key
    if (target / ".complete").exists():
        return target
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    args = [
        *command, "export", "openvino", "--model", str(src),
        "--task", "text-generation-with-past", "--weight-format", "fp32", str(partial),
    ]  # fmt: skip
    log.info("exporting %s to OpenVINO IR (once): %s", src.name, " ".join(args))
    done = subprocess.run(  # a local directory: the export reads no hub
        args,
        capture_output=True,
        text=True,
        timeout=_EXPORT_TIMEOUT,
        preexec_fn=die_with_parent,  # the export dies with the worker
    )
    if done.returncode != 0 or not (partial / "openvino_model.xml").exists():
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(f"the OpenVINO export failed: {(done.stderr or done.stdout)[-1500:]}")
    (partial / ".complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    try:
        partial.rename(target)
    except OSError:  # another worker finished first: use its copy
        shutil.rmtree(partial, ignore_errors=True)
    return target


class _Sequence:
    """One sequence in the pipeline: its handle, its text and how far it got."""

    __slots__ = ("finished", "generated", "handle", "req", "tracker")

    def __init__(self, req: SequenceRequest, handle, tracker: TextTracker) -> None:
        self.req = req
        self.handle = handle
        self.tracker = tracker
        self.generated = 0
        self.finished = False


class OpenVINORuntime(GenerationRuntime):
    """One OpenVINO GenAI continuous-batching pipeline for one model, on its own thread;
    requests it cannot serve go to a transformers engine beside it."""

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
        self._lock = threading.Condition()
        self._pending: list[SequenceRequest] = []
        self._cancelled: set[str] = set()
        self._active: list[_Sequence] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._max_batch = 0
        self._fallback = _Fallback(lambda: TransformersRuntime(spec, max_running, "cpu", max_loras))

    # Lifecycle --------------------------------------------------------------------------

    def start(self, path: str, on_events: Callable[[list[TokenEvent]], None]) -> None:
        import openvino_genai as og
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
        ir = openvino_ir(path, self._cache_dir, export_command(self._settings))
        scheduler = og.SchedulerConfig()
        scheduler.cache_size = max(1, round(self._settings.openvino_cache_gb))
        scheduler.max_num_seqs = self.max_running
        scheduler.dynamic_split_fuse = True
        scheduler.enable_prefix_caching = True
        exact = self.spec.profile.dtype == "float32"
        properties = {"INFERENCE_NUM_THREADS": self._threads}
        if exact:
            properties |= {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
        self._pipe = og.ContinuousBatchingPipeline(str(ir), scheduler, "CPU", properties)
        self._og = og
        log.info(
            "OpenVINO runtime for %s: %d threads, %s, up to %d sequences",
            self.spec.id,
            self._threads,
            "float32 (exact)" if exact else "the CPU's fastest precision",
            self.max_running,
        )
        self._thread = threading.Thread(target=self._run, name="shoal-openvino", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._fallback.stop()

    @property
    def context(self) -> int:
        return self._context

    def submit(self, requests: list[SequenceRequest]) -> None:
        mine = [r for r in requests if not _needs_torch(r)]
        if len(mine) < len(requests):
            self._fallback.submit([r for r in requests if _needs_torch(r)])
        if mine:
            with self._lock:
                self._pending.extend(mine)
                self._lock.notify_all()

    def cancel(self, job: str) -> None:
        with self._lock:
            self._cancelled.add(job)
            self._lock.notify_all()
        self._fallback.cancel(job)

    @property
    def running(self) -> int:
        return len(self._active) + len(self._pending) + self._fallback.running

    @property
    def max_batch(self) -> int:
        return max(self._max_batch, self._fallback.max_batch)

    @property
    def engine_name(self) -> str:
        precision = "float32" if self.spec.profile.dtype == "float32" else "the CPU's fastest"
        return f"openvino {precision}"

    # The engine thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and not self._pending and not self._active:
                    self._lock.wait(timeout=1.0)
                if self._stopping:
                    for seq in self._active:
                        seq.handle.cancel()
                    return
                new, self._pending = self._pending, []
                cancelled, self._cancelled = self._cancelled, set()
            try:
                self._admit([r for r in new if r.job not in cancelled], cancelled)
                if self._active:
                    self._pipe.step()
                    self._max_batch = max(self._max_batch, len(self._active))
                    self._collect()
            except Exception as exc:
                log.exception("OpenVINO generation step failed")
                events = [TokenEvent(s.req.job, s.req.choice, error=str(exc)) for s in self._active]
                for seq in self._active:
                    seq.handle.cancel()
                self._active = []
                self._on_events(events)

    def _admit(self, requests: list[SequenceRequest], cancelled: set[str]) -> None:
        for seq in [s for s in self._active if s.req.job in cancelled]:
            seq.handle.cancel()  # leaves the batch and frees its KV blocks next step
        self._active = [s for s in self._active if s.req.job not in cancelled]
        refused: list[TokenEvent] = []
        for req in requests:
            try:
                ids = self._og_tensor(req.prompt_ids)
                handle = self._pipe.add_request(_request_id(req), ids, self._config(req))
            except Exception as exc:  # one request the engine refuses fails alone
                log.exception("OpenVINO refused request %s", req.job)
                refused.append(TokenEvent(req.job, req.choice, error=str(exc)))
                continue
            tracker = TextTracker(self._decode, list(req.sampling.stop))
            self._active.append(_Sequence(req, handle, tracker))
        if refused:
            self._on_events(refused)

    def _og_tensor(self, ids: list[int]):
        import numpy as np
        import openvino as ov

        return ov.Tensor(np.asarray([ids], dtype=np.int64))

    def _config(self, req: SequenceRequest):
        og, s = self._og, req.sampling
        config = og.GenerationConfig()
        config.max_new_tokens = req.max_new
        config.ignore_eos = False
        if s.temperature > 0:
            config.do_sample = True
            config.temperature = s.temperature
            # OpenVINO holds top_p as a float32, in which a top_p below ~1e-38 is 0 and
            # refused; every top_p that small keeps only the likeliest token, so the floor
            # changes no answer.
            config.top_p = max(s.top_p, _SMALLEST_TOP_P)
            config.rng_seed = (s.seed + req.choice) % 2**63
        config.presence_penalty = s.presence_penalty
        config.frequency_penalty = s.frequency_penalty
        if s.logprobs:
            config.logprobs = 1
        if s.json_schema:
            config.structured_output_config = og.StructuredOutputConfig(json_schema=s.json_schema)
        return config

    def _collect(self) -> None:
        events: list[TokenEvent] = []
        done = []
        for seq in self._active:
            status = seq.handle.get_status()
            if seq.handle.can_read():
                for output in seq.handle.read().values():
                    logprobs = list(output.generated_log_probs or [])
                    for k, token in enumerate(output.generated_ids):
                        if seq.finished:
                            break
                        logprob = logprobs[k] if k < len(logprobs) else None
                        events.append(self._advance(seq, token, logprob))
            if not seq.finished and status != self._og.GenerationStatus.RUNNING:
                if status == self._og.GenerationStatus.IGNORED:
                    events.append(
                        TokenEvent(seq.req.job, seq.req.choice, error="the pipeline ignored it")
                    )
                else:
                    events.append(
                        self._finish(seq, "length" if seq.generated >= seq.req.max_new else "stop")
                    )
            if seq.finished:
                done.append(seq)
        if done:
            self._active = [s for s in self._active if not s.finished]
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
            seq.handle.cancel()  # a stop string: the rest is not wanted
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


def _needs_torch(req: SequenceRequest) -> bool:
    """What GenAI cannot do per request in a step loop: LoRA, alternatives' logprobs."""
    return bool(req.adapter) or req.sampling.top_logprobs > 0


def _request_id(req: SequenceRequest) -> int:
    return int.from_bytes(
        hashlib.blake2b(f"{req.job}:{req.choice}".encode(), digest_size=7).digest()
    )


class _Fallback:
    """The transformers engine for what GenAI cannot do, loaded on its first request (on
    a thread of its own, so the pipeline keeps stepping meanwhile)."""

    def __init__(self, make: Callable[[], GenerationRuntime]) -> None:
        self._make = make
        self.path = ""
        self.on_events: Callable[[list[TokenEvent]], None] = lambda events: None
        self._runtime: GenerationRuntime | None = None
        self._waiting: list[SequenceRequest] = []
        self._loading = False
        self._lock = threading.Lock()

    def submit(self, requests: list[SequenceRequest]) -> None:
        with self._lock:
            if self._runtime is not None:
                self._runtime.submit(requests)
                return
            self._waiting.extend(requests)
            if self._loading:
                return
            self._loading = True
        threading.Thread(target=self._load, name="shoal-gen-fallback", daemon=True).start()

    def _load(self) -> None:
        log.info("loading the transformers engine beside OpenVINO (LoRA or top_logprobs)")
        try:
            runtime = self._make()
            runtime.start(self.path, self.on_events)
        except Exception as exc:
            log.exception("the transformers engine failed to load")
            with self._lock:
                waiting, self._waiting, self._loading = self._waiting, [], False
            self.on_events([TokenEvent(r.job, r.choice, error=str(exc)) for r in waiting])
            return
        with self._lock:
            self._runtime, waiting, self._waiting = runtime, self._waiting, []
        if waiting:
            runtime.submit(waiting)

    def cancel(self, job: str) -> None:
        with self._lock:
            self._waiting = [r for r in self._waiting if r.job != job]
            runtime = self._runtime
        if runtime is not None:
            runtime.cancel(job)

    @property
    def running(self) -> int:
        runtime = self._runtime
        return len(self._waiting) + (runtime.running if runtime is not None else 0)

    @property
    def max_batch(self) -> int:
        return self._runtime.max_batch if self._runtime is not None else 0

    def stop(self) -> None:
        if self._runtime is not None:
            self._runtime.stop()
