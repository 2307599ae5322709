"""Continuous batching for a transformers causal LM, on its own thread.

Every step feeds each running sequence its last token and samples its next one, in one
batched forward pass over a shared KV cache. New sequences join between steps: their
prompts (all but the last token) are prefilled as one left-padded batch and their cache
rows merged into the running cache, left-padded to a common length; finished or
cancelled sequences leave by dropping their rows, and cache columns that no running
sequence needs any more are trimmed. The prompt is prefilled once and never recomputed;
each sequence keeps its own seed, penalties, stop strings and grammar.

All running sequences share one LoRA adapter (peft runs one adapter per forward pass);
sequences for another adapter wait until the running ones finish.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ...queue.messages import Sampling
from .grammar import Grammar
from .sampling import RowParams, sample
from .text import TextTracker

__all__ = ["Engine", "SequenceRequest", "TokenEvent"]

log = logging.getLogger(__name__)


@dataclass
class SequenceRequest:
    """One sequence (one choice of one job) for a runtime."""

    job: str
    """The job this sequence belongs to (several choices share it)."""
    choice: int
    prompt_ids: list[int]
    max_new: int
    sampling: Sampling
    adapter: str = ""
    adapter_path: str = ""


@dataclass
class TokenEvent:
    """What a runtime tells of one sequence after a step."""

    job: str
    choice: int
    text: str = ""
    token: str | None = None
    logprob: float | None = None
    token_bytes: list[int] = field(default_factory=list)
    top: list[tuple[str, float, list[int]]] = field(default_factory=list)
    finish: str = ""
    error: str = ""
    generated: int = 0
    """1 when this event is a generated token (0 for the end-of-sequence token)."""


class _Sequence:
    def __init__(self, req: SequenceRequest, tracker: TextTracker, grammar: Grammar | None):
        self.req = req
        self.tracker = tracker
        self.grammar = grammar
        self.generated = 0
        generator = torch.Generator()
        generator.manual_seed(req.sampling.seed + req.choice)
        s = req.sampling
        self.params = RowParams(
            s.temperature,
            s.top_p,
            s.presence_penalty,
            s.frequency_penalty,
            generator,
            s.top_logprobs,
            s.logprobs,
        )


class Engine:
    """Continuous batching of causal-LM sequences with transformers, on its own thread."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        context: int,
        max_running: int,
        on_events: Callable[[list[TokenEvent]], None],
        lora=None,
        grammar_factory: Callable[[str], Grammar] | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.context = context
        self.max_running = max_running
        self._on_events = on_events
        self._lora = lora
        self._grammar_factory = grammar_factory
        self.device = next(model.parameters()).device
        self.vocab = model.config.vocab_size
        eos = model.generation_config.eos_token_id if model.generation_config else None
        eos = eos if eos is not None else tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._pending: deque[SequenceRequest] = deque()
        self._cancelled: set[str] = set()
        self._lock = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._active: list[_Sequence] = []
        self._adapter = ""
        self._cache = None
        self._mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)
        self._next_tokens: list[int] = []
        self._counts = torch.zeros((0, self.vocab))
        self.steps = 0
        self.max_batch = 0
        self.rows_stepped = 0

    # Threads ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="shoal-generate", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def submit(self, requests: list[SequenceRequest]) -> None:
        with self._lock:
            self._pending.extend(requests)
            self._lock.notify_all()

    def cancel(self, job: str) -> None:
        with self._lock:
            self._cancelled.add(job)
            self._lock.notify_all()

    @property
    def running(self) -> int:
        return len(self._active) + len(self._pending)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and not self._pending and not self._active:
                    self._lock.wait(timeout=1.0)
                if self._stopping:
                    return
                cancelled, self._cancelled = self._cancelled, set()
                self._pending = deque(r for r in self._pending if r.job not in cancelled)
                admitted = self._take_admissible()
            try:
                with torch.inference_mode():
                    self._drop([s for s in self._active if s.req.job in cancelled], emit=False)
                    if admitted:
                        self._admit(admitted)
                    if self._active:
                        self._step()
            except Exception as exc:
                log.exception("generation step failed")
                events = [TokenEvent(s.req.job, s.req.choice, error=str(exc)) for s in self._active]
                self._reset()
                self._on_events(events)

    def _take_admissible(self) -> list[SequenceRequest]:
        room = self.max_running - len(self._active)
        if room <= 0 or not self._pending:
            return []
        if not self._active:
            self._adapter = self._pending[0].adapter
        taken = []
        kept: deque[SequenceRequest] = deque()
        while self._pending:
            req = self._pending.popleft()
            if len(taken) < room and req.adapter == self._adapter:
                taken.append(req)
            else:
                kept.append(req)
        self._pending = kept
        return taken

    # Batch state ------------------------------------------------------------------------

    def _forward(self, **inputs):
        if self._lora is None:
            return self.model(**inputs)
        with self._lora.active(self._adapter):
            return self.model(**inputs)

    def _admit(self, requests: list[SequenceRequest]) -> None:
        if self._lora is not None:
            for req in requests:
                if req.adapter:
                    self._lora.ensure(req.adapter, req.adapter_path)
        sequences = []
        for req in requests:
            stops = list(req.sampling.stop)
            tracker = TextTracker(self._decode, stops)
            grammar = None
            if req.sampling.json_schema and self._grammar_factory is not None:
                grammar = self._grammar_factory(req.sampling.json_schema)
            sequences.append(_Sequence(req, tracker, grammar))
        prefixes = [req.prompt_ids[:-1] for req in requests]
        width = max(len(p) for p in prefixes)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        layers = None
        if width:
            ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
            for i, prefix in enumerate(prefixes):
                if prefix:
                    ids[i, width - len(prefix) :] = torch.tensor(prefix)
                    mask[i, width - len(prefix) :] = 1
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = self._forward(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                position_ids=positions.to(self.device),
                use_cache=True,
                logits_to_keep=1,
            )
            layers = [(layer.keys, layer.values) for layer in out.cache.layers]
            new_cache = out.cache
        else:
            new_cache = None
        self._merge(new_cache, layers, mask.to(self.device), len(requests))
        self._active.extend(sequences)
        self._next_tokens.extend(req.prompt_ids[-1] for req in requests)
        self._counts = torch.cat([self._counts, torch.zeros((len(requests), self.vocab))])

    def _merge(self, new_cache, layers, new_mask: torch.Tensor, rows: int) -> None:
        old_width = self._mask.shape[1]
        width = max(old_width, new_mask.shape[1])
        old_mask = F.pad(self._mask, (width - old_width, 0))
        new_mask = F.pad(new_mask, (width - new_mask.shape[1], 0))
        if self._cache is None and new_cache is None:
            self._mask = torch.cat([old_mask, new_mask])
            return
        if self._cache is None:
            # Only the newcomers have cache rows: give the running rows (all padding) zeros.
            self._cache = new_cache
            for layer in self._cache.layers:
                for name in ("keys", "values"):
                    t = getattr(layer, name)
                    t = F.pad(t, (0, 0, width - t.shape[2], 0))
                    pad = torch.zeros(
                        (old_mask.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device
                    )
                    setattr(layer, name, torch.cat([pad, t]))
        else:
            for i, layer in enumerate(self._cache.layers):
                for j, name in enumerate(("keys", "values")):
                    t = getattr(layer, name)
                    t = F.pad(t, (0, 0, width - t.shape[2], 0))
                    if layers is None:
                        add = torch.zeros((rows, *t.shape[1:]), dtype=t.dtype, device=t.device)
                    else:
                        add = layers[i][j]
                        add = F.pad(add, (0, 0, width - add.shape[2], 0))
                    setattr(layer, name, torch.cat([t, add]))
        self._mask = torch.cat([old_mask, new_mask])

    def _drop(self, gone: list[_Sequence], emit: bool = True) -> None:
        if not gone:
            return
        gone_ids = {id(s) for s in gone}
        keep = [i for i, s in enumerate(self._active) if id(s) not in gone_ids]
        self._active = [self._active[i] for i in keep]
        self._next_tokens = [self._next_tokens[i] for i in keep]
        if not keep:
            self._reset()
            return
        index = torch.tensor(keep, device=self.device)
        self._mask = self._mask[index]
        self._counts = self._counts[torch.tensor(keep)]
        # Columns no remaining sequence uses (left padding) go too.
        used = self._mask.sum(0).nonzero()
        start = int(used[0]) if len(used) else self._mask.shape[1]
        self._mask = self._mask[:, start:]
        if self._cache is not None:
            for layer in self._cache.layers:
                layer.keys = layer.keys[index, :, start:]
                layer.values = layer.values[index, :, start:]

    def _reset(self) -> None:
        self._active = []
        self._next_tokens = []
        self._cache = None
        self._mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)
        self._counts = torch.zeros((0, self.vocab))

    # One step -----------------------------------------------------------------------------

    def _step(self) -> None:
        rows = len(self._active)
        ids = torch.tensor(self._next_tokens, device=self.device)[:, None]
        positions = self._mask.sum(1, keepdim=True)
        mask = torch.cat(
            [self._mask, torch.ones((rows, 1), dtype=torch.long, device=self.device)], dim=1
        )
        out = self._forward(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            cache=self._cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self._cache = out.cache
        self._mask = mask
        logits = out.logits[:, -1, : self.vocab].float().cpu()
        allowed = self._grammar_mask(logits.shape[1])
        tokens, chosen, tops, failed = sample(
            logits, [s.params for s in self._active], self._counts, allowed
        )
        self.steps += 1
        self.rows_stepped += rows
        self.max_batch = max(self.max_batch, rows)
        # A row whose draw failed fails its job (every choice: the worker retries or fails
        # the job as a whole); the other sequences of the batch go on.
        broken: dict[str, TokenEvent] = {}
        for i, error in failed.items():
            req = self._active[i].req
            log.error("sampling for %s choice %d failed: %s", req.job, req.choice, error)
            broken.setdefault(req.job, TokenEvent(req.job, req.choice, error=error))
        events, done = list(broken.values()), []
        for i, (seq, token) in enumerate(zip(self._active, tokens, strict=True)):
            if seq.req.job in broken:
                done.append(seq)
                continue
            event, finished = self._advance(seq, token, positions[i].item() + 1)
            if chosen is not None and seq.params.want_logprobs and token not in self.eos:
                self._attach_logprobs(event, token, chosen[i], tops[i] if tops else [])
            self._counts[i, token] += 1
            self._next_tokens[i] = token
            events.append(event)
            if finished:
                done.append(seq)
        self._drop(done)
        self._on_events(events)

    def _advance(self, seq: _Sequence, token: int, cached: int) -> tuple[TokenEvent, bool]:
        req = seq.req
        event = TokenEvent(req.job, req.choice)
        if token in self.eos:
            event.text = seq.tracker.finish()
            event.finish = "stop"
            return event, True
        seq.generated += 1
        event.generated = 1
        if seq.grammar is not None:
            seq.grammar.consume(token)
        event.text = seq.tracker.add(token)
        if seq.tracker.stopped or (seq.grammar is not None and seq.grammar.done):
            event.text += seq.tracker.finish() if not seq.tracker.stopped else ""
            event.finish = "stop"
        elif seq.generated >= req.max_new or cached + 1 >= self.context:
            event.text += seq.tracker.finish()
            event.finish = "length"
        return event, bool(event.finish)

    def _attach_logprobs(
        self, event: TokenEvent, token: int, logprob: float, top: list[tuple[int, float]]
    ) -> None:
        event.token, event.token_bytes = self._token_text(token)
        event.logprob = logprob
        for alternative, value in top:
            text, raw = self._token_text(alternative)
            event.top.append((text, value, raw))

    def _token_text(self, token: int) -> tuple[str, list[int]]:
        text = self.tokenizer.decode([token])
        return text, list(text.encode("utf-8"))

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _grammar_mask(self, width: int) -> torch.Tensor | None:
        if not any(s.grammar is not None for s in self._active):
            return None
        allowed = torch.ones((len(self._active), width), dtype=torch.bool)
        for i, seq in enumerate(self._active):
            if seq.grammar is not None:
                allowed[i] = seq.grammar.allowed(width)
        return allowed
