"""Generation runtimes behind one interface: the in-process transformers engine, or an
SGLang server the worker supervises (shoal/workers/generation/sglang.py)."""

from __future__ import annotations

import asyncio
import functools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from tokenizers import Tokenizer

from ...model_registry import ModelSpec
from ...queue.messages import ChatTurn, TokenizeJob, TokensResult
from ..tokens import answers, plain_tokenizer
from .engine import Engine, SequenceRequest, TokenEvent

__all__ = ["GenerationRuntime", "TransformersRuntime", "chat_prompt_ids", "stop_runtimes"]

log = logging.getLogger(__name__)


def chat_prompt_ids(tokenizer, messages: Sequence[ChatTurn], prompt: str) -> list[int]:
    """A chat's tokens through the model's chat template, or a completion prompt's."""
    if messages:
        turns = [{"role": m.role, "content": m.content} for m in messages]
        encoded = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
        return list(ids)
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


class GenerationRuntime(ABC):
    """Runs sequences; reports their tokens through the `on_events` callback (from any
    thread: the caller hands them back to its event loop)."""

    tokenizer: Any
    """The model's transformers tokenizer, loaded by `start`."""
    drafted = 0
    """Sequences decoded speculatively so far (a draft model proposing tokens)."""
    drafted_moved = 0
    """Of those, how many moved to the main batch midway."""

    def __init__(self, spec: ModelSpec, max_running: int) -> None:
        self.spec = spec
        self.max_running = max_running

    @abstractmethod
    def start(self, path: str, on_events: Callable[[list[TokenEvent]], None]) -> None:
        """Load the model from `path` and begin serving (blocking; call off the loop)."""

    @abstractmethod
    def stop(self) -> None: ...

    @property
    @abstractmethod
    def context(self) -> int:
        """Longest prompt plus output, in tokens."""

    def prompt_ids(self, messages: Sequence[ChatTurn], prompt: str) -> list[int]:
        """The prompt's tokens: the chat template applied to `messages`, or `prompt` (with
        the tokenizer `start` loaded)."""
        return chat_prompt_ids(self.tokenizer, messages, prompt)

    @functools.cached_property
    def _plain_tokenizer(self) -> Tokenizer | None:
        backend = getattr(getattr(self, "tokenizer", None), "backend_tokenizer", None)
        return plain_tokenizer(backend) if backend is not None else None

    def tokens(self, jobs: list[TokenizeJob]) -> list[TokensResult | str]:
        """Tokenize jobs' answers, from the tokenizer the model is prompted with (a chat's
        ids are `prompt_ids`' own)."""
        return answers(
            self._plain_tokenizer, jobs, self.context, lambda turns: self.prompt_ids(turns, "")
        )

    @abstractmethod
    def submit(self, requests: list[SequenceRequest]) -> None: ...

    @abstractmethod
    def cancel(self, job: str) -> None: ...

    @property
    @abstractmethod
    def running(self) -> int:
        """Sequences admitted or waiting to be."""

    @property
    def max_batch(self) -> int:
        """The largest batch a step has run (continuous batching at work when > 1)."""
        return 0

    @property
    def engine_name(self) -> str:
        """What runs the model and in which precision, for heartbeats and /v1/models."""
        return f"torch {self.spec.profile.dtype}"


class TransformersRuntime(GenerationRuntime):
    """A causal LM with transformers, continuously batched by `Engine` on its own thread."""

    def __init__(
        self, spec: ModelSpec, max_running: int, device: str = "auto", max_loras: int = 8
    ) -> None:
        super().__init__(spec, max_running)
        self._device = device
        self._max_loras = max_loras
        self.engine: Engine | None = None

    def start(self, path: str, on_events: Callable[[list[TokenEvent]], None]) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from ..adapters.lora import LoraSlots
        from ..adapters.sentence_transformers import pick_device
        from .grammar import GrammarFactory

        device = pick_device(self._device)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        dtype = getattr(torch, self.spec.profile.dtype)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        self._model = model
        limit = getattr(model.config, "max_position_embeddings", None) or self.spec.max_length
        self._context = min(self.spec.max_length, limit)
        lora = LoraSlots(lambda: self._model, self._set_model, self._max_loras)
        self.engine = Engine(
            model,
            self.tokenizer,
            self._context,
            self.max_running,
            on_events,
            lora=lora,
            grammar_factory=GrammarFactory(self.tokenizer),
        )
        self.engine.start()

    def _set_model(self, model) -> None:
        self._model = model
        if self.engine is not None:
            self.engine.model = model

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()

    @property
    def context(self) -> int:
        return self._context

    def submit(self, requests: list[SequenceRequest]) -> None:
        assert self.engine is not None
        self.engine.submit(requests)

    def cancel(self, job: str) -> None:
        if self.engine is not None:
            self.engine.cancel(job)

    @property
    def running(self) -> int:
        return self.engine.running if self.engine is not None else 0

    @property
    def max_batch(self) -> int:
        return self.engine.max_batch if self.engine is not None else 0

    @property
    def engine_name(self) -> str:
        device = self.engine.device.type if self.engine is not None else "cpu"
        name = super().engine_name
        return name if device == "cpu" else f"{name} ({device})"


async def stop_runtimes(runtimes: list[GenerationRuntime], within: float = 3.0) -> None:
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
