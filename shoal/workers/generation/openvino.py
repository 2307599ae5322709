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

Precision: `dtype = "float32"` (the default) compiles with f32 inference precision and
an f32 KV cache: greedy answers equal transformers' float32 token for token (tested).
OpenVINO's own default on a CPU with native bf16 is bf16, which is faster and not
exact; `dtype = "bfloat16"` asks for it. `weights = "int8"` serves a second export with
int8 weights (per output channel; computed in the `dtype` above), about 2x one stream's
tokens/s on a CPU, once weight_guard.py has measured that it picks the same next token as
the full model often enough on its probe chats; LoRA and `top_logprobs` requests still go
to the transformers engine at full precision.

Speculative decoding (`generator.openvino_draft_tokens`, 4 by default): a greedy sequence
that runs alone is decoded by a second pipeline in the same process, where the model's
int8 export drafts tokens and the float32 model checks them (openvino_host.py says how,
and how the sequence moves to the main batch once another arrives). Answers stay the
float32 model's; one stream runs ~1.4x faster on a 2-core EPYC. The second pipeline
takes ~1 GB; a 3-10% loss at 8-32 streams with it loaded, seen in every run of one
session there, was gone hours later on the same VM (perf/results/README.md).

The model's OpenVINO IR is made once from the model's transformers directory by
`optimum-cli export openvino` (optimum-intel), which pins a transformers older than
Shoal's, so it runs from its own environment (`generator.openvino_export_command`, by
default the `.venv-export` that `make setup` builds beside `.venv`), and is cached in
the data dir.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path

from ...config import GeneratorSettings
from ...lifecycle import die_with_parent
from ...model_registry import ModelSpec
from ...model_registry.cache_dirs import is_complete, partial_dir, publish
from .engine import SequenceRequest, TokenEvent
from .openvino_host import host
from .runtime import GenerationRuntime, TransformersRuntime
from .text import TextTracker
from .weight_guard import agreement, probe_sequences

__all__ = ["OpenVINORuntime", "export_command", "openvino_ir"]

log = logging.getLogger(__name__)

_EXPORT_TIMEOUT = 3600.0
_SMALLEST_TOP_P = 1e-30  # a normal float32, far below any top_p that keeps two tokens
_SMALLEST_TEMPERATURE = 1e-30  # below it sampling is greedy in any float precision
_KV_BLOCK = 32  # tokens per KV-cache block of GenAI's CPU paged attention
_RESTARTS = 3  # a pipeline process that dies more often than this ...
_RESTART_WINDOW_S = 600.0  # ... within this is not restarted again


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


def openvino_ir(
    source: str, cache_dir: Path, command: Sequence[str], weights: str = "fp32"
) -> Path:
    """The OpenVINO IR of the transformers model directory `source`: exported on first
    use (`weights`: optimum-cli's `--weight-format`, fp32 or int8), then read from the
    cache. Safe against a crash mid-export (a copy is used only once complete) and
    against two workers exporting at once."""
    src = Path(source)
    stamp = [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(src.iterdir())]
    if weights != "fp32":  # the float32 copy keeps the key it always had
        stamp.append(weights)
    key = hashlib.sha256(f"{src.resolve()}|{'|'.join(stamp)}".encode()).hexdigest()[:20]
    target = cache_dir / "openvino" / key
    if is_complete(target):
        return target
    partial = partial_dir(target)
    args = [
        *command, "export", "openvino", "--model", str(src),
        "--task", "text-generation-with-past", "--weight-format", weights, str(partial),
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
    return publish(partial, target)


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
        self._weights: str | None = None  # int8 weights served: how close they measured
        self._assisted = False  # a lone greedy sequence is decoded speculatively
        self._host_args: tuple = ()
        self._backlog: list[tuple] | None = None
        """While the pipeline's process restarts: what to send it once it is up."""
        self._restarts: deque[float] = deque(maxlen=_RESTARTS)
        self._fallback = _Fallback(lambda: TransformersRuntime(spec, max_running, "cpu", max_loras))

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
        ir = openvino_ir(path, self._cache_dir, export_command(self._settings))
        if self.spec.profile.weights == "int8":
            ir = self._compressed_if_close(path, ir)
        scheduler = {
            "cache_size": max(1, round(self._settings.openvino_cache_gb)),
            "max_num_seqs": self.max_running,
            "dynamic_split_fuse": True,
            "enable_prefix_caching": True,
        }
        exact = self.spec.profile.dtype == "float32"
        properties: dict[str, object] = {"INFERENCE_NUM_THREADS": self._threads}
        if exact:
            properties |= {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
        assist = self._assist(path) if self._weights is None else None
        self._host_args = (str(ir), scheduler, properties, assist)
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
            while (answer := conn.recv())[0] == "warning":
                log.warning("%s: %s", self.spec.id, answer[1])
        except EOFError:
            answer = ("failed", f"the OpenVINO process exited ({process.exitcode})")
        if answer[0] != "ready":
            process.join(timeout=5)
            raise RuntimeError(f"OpenVINO could not load {self.spec.id}: {answer[1]}")
        self._assisted = answer[1]
        with self._lock:
            if self._stopping:
                process.kill()
                raise RuntimeError("stopping")
            self._conn = conn
            backlog, self._backlog = self._backlog or [], None
            for message in backlog:
                # An add whose sequence was failed meanwhile would only hold a slot.
                if message[0] != "add" or message[1] in self._active:
                    conn.send(message)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            process, restarting = self._process, self._backlog is not None
        if process is not None and process.is_alive():
            if not restarting:  # it can stop cleanly
                self._send(("stop",))
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
        mine = [r for r in requests if not _needs_torch(r)]
        if len(mine) < len(requests):
            self._fallback.submit([r for r in requests if _needs_torch(r)])
        for req in mine:
            rid = _request_id(req)
            seq = _Sequence(req, rid, TextTracker(self._decode, list(req.sampling.stop)))
            with self._lock:
                self._active[rid] = seq
            alone = len(mine) == 1 and _may_assist(req)  # a job of n choices never drafts
            message = ("add", rid, req.prompt_ids, _fields(req), alone)
            if not self._send(message):
                self._fail([seq], "the OpenVINO process is gone")

    def cancel(self, job: str) -> None:
        with self._lock:
            gone = [s for s in self._active.values() if s.req.job == job]
            for seq in gone:
                del self._active[seq.rid]
        for seq in gone:
            self._send(("cancel", seq.rid))
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
        if self._weights is not None:
            return f"openvino {precision}, int8 weights ({self._weights})"
        if self._assisted:
            return f"openvino {precision}, int8 draft when alone"
        return f"openvino {precision}"

    def _assist(self, path: str) -> dict[str, object] | None:
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
        return {"draft": str(draft), "scheduler": scheduler, "tokens": tokens}

    def _compressed_if_close(self, path: str, full: Path) -> Path:
        """The int8 IR if it agrees with `full` enough on the probe chats, else `full`
        (also when the export or the check fails: full precision still serves)."""
        try:
            compressed = openvino_ir(path, self._cache_dir, export_command(self._settings), "int8")
            probe = probe_sequences(self.tokenizer)
            measured = agreement(full, compressed, probe, self._threads)
        except Exception as exc:
            log.warning(
                "%s: int8 weights not served (%s): serving full precision", self.spec.id, exc
            )
            return full
        floor = self._settings.min_weight_agreement
        said = f"top-1 agreement {measured.top1:.3f}, mean KL {measured.kl:.4f} nats"
        if measured.top1 < floor:
            log.warning(
                "%s: int8 weights not served (%s on %d probe positions, below %.3f): "
                "serving full precision",
                self.spec.id, said, measured.positions, floor,
            )  # fmt: skip
            return full
        self._weights = said
        return compressed

    # Talking to the pipeline's process ------------------------------------------------------

    def _send(self, message: tuple) -> bool:
        """Whether `message` reached the pipe (False once the process is gone)."""
        assert self._conn is not None
        try:
            with self._lock:
                if self._backlog is not None:
                    self._backlog.append(message)
                else:
                    self._conn.send(message)
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
                message = self._conn.recv()
            except (EOFError, OSError):
                if self._stopping or not self._restarted():
                    return
                continue
            if message[0] == "step":
                self._max_batch = max(self._max_batch, message[2])
                self.drafted += message[3]
                self.drafted_moved += message[4]
                self._collect(message[1])
            elif message[0] == "refused":
                log.error("OpenVINO refused a request: %s", message[2])
                seq = self._active.get(message[1])
                if seq is not None:
                    self._fail([seq], message[2])
            else:  # a step failed: the process dropped every sequence
                log.error("OpenVINO generation step failed: %s", message[1])
                self._fail(list(self._active.values()), message[1])

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
            lost = [self._active[m[1]] for m in backlog if m[0] == "add" and m[1] in self._active]
        self._fail(lost, "the OpenVINO process is gone")
        return False

    def _fail(self, seqs: list[_Sequence], error: str) -> None:
        with self._lock:
            for seq in seqs:
                self._active.pop(seq.rid, None)
        self._on_events([TokenEvent(s.req.job, s.req.choice, error=error) for s in seqs])

    def _collect(self, results: list[tuple[int, list[int], list[float], str]]) -> None:
        events: list[TokenEvent] = []
        for rid, tokens, logprobs, state in results:
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
                    self._send(("cancel", rid))
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

    def send(self, message: tuple) -> None:
        raise OSError("the OpenVINO process is gone")

    def recv(self) -> tuple:
        raise EOFError


def _fields(req: SequenceRequest) -> dict[str, object]:
    """The request's GenerationConfig, as fields the pipeline's process sets."""
    s = req.sampling
    fields: dict[str, object] = {"max_new_tokens": req.max_new, "ignore_eos": False}
    # OpenVINO holds temperature and top_p as float32, in which values below ~1e-38 are 0
    # and refused (or divide by zero). A temperature that small samples the likeliest
    # token with certainty: greedy; a top_p that small keeps only the likeliest token,
    # so the floor changes no answer.
    if s.temperature > _SMALLEST_TEMPERATURE:
        fields |= {
            "do_sample": True,
            "temperature": s.temperature,
            "top_p": max(s.top_p, _SMALLEST_TOP_P),
            "rng_seed": (s.seed + req.choice) % 2**63,
        }
    fields |= {"presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty}
    if s.logprobs:
        fields["logprobs"] = 1
    if s.json_schema:
        fields["json_schema"] = s.json_schema
    return fields


def _may_assist(req: SequenceRequest) -> bool:
    """Whether a draft may propose this sequence's tokens: only where the full model's
    check alone picks each token (greedy), and where moving the sequence to the main
    pipeline midway, as a longer prompt, changes nothing: penalties count generated
    tokens only, a schema's grammar would start again. GenAI's assisted sampling failed
    its own checks when tried (2026.4.1)."""
    s = req.sampling
    return (
        s.temperature <= _SMALLEST_TEMPERATURE
        and not s.presence_penalty
        and not s.frequency_penalty
        and not s.json_schema
    )


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
