"""One model an encoder worker serves: its adapter, residency state, batchers and the
jobs parked while it loads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

from ...model_registry import ModelSpec
from ...queue.messages import TokenizeJob, TokensResult
from ..adapters.base import EncoderAdapter
from ..batcher import Batcher
from ..tokens import answers
from .held import EncoderHeld, Unit

__all__ = ["BatcherKey", "EncoderModel", "ModelState"]


class BatcherKey(NamedTuple):
    """Which batcher a unit waits in: batches never mix ops or LoRA adapters, and
    batch-lane work never delays live work inside a batch."""

    op: str
    lora: str
    """The LoRA adapter's name; "" for the base model."""
    batch_lane: bool
    """From the low-priority batch lane."""


ModelState = Literal["unloaded", "loading", "resident", "failed"]


class EncoderModel:
    """A model an encoder worker serves, resident or not, with its batchers."""

    def __init__(
        self, spec: ModelSpec, adapter: EncoderAdapter, clock: Callable[[], float]
    ) -> None:
        self.spec = spec
        self.adapter = adapter
        self._clock = clock
        self.state: ModelState = "unloaded"
        self.error = ""
        """Why loading failed (state `failed`)."""
        self.batchers: dict[BatcherKey, Batcher[Unit]] = {}
        self.waiting: list[EncoderHeld] = []
        """Jobs pulled while the model was not resident: tokenized once it is."""
        self.running = 0
        self.seconds_per_token = 0.0
        """Forward-pass time per padded token, a moving average (0 until measured)."""

    def note_forward(self, seconds: float, padded_tokens: int) -> None:
        per_token = seconds / max(1, padded_tokens)
        if self.seconds_per_token <= 0:
            self.seconds_per_token = per_token
        else:
            self.seconds_per_token += 0.2 * (per_token - self.seconds_per_token)

    def tokens(self, jobs: list[TokenizeJob]) -> list[TokensResult | str]:
        """Tokenize jobs' answers, from the tokenizer the model runs on (resident only)."""
        tokenizer = getattr(self.adapter, "tokenizer", None)
        whole = tokenizer.whole if tokenizer is not None else None
        return answers(whole, jobs, self.adapter.max_length)

    @property
    def id(self) -> str:
        return self.spec.id

    def use_profile(self, spec: ModelSpec) -> None:
        """Serve `spec`, the current spec with another batching profile: the batchers
        take it at once; its `dtype` and `engine` apply when the model is next loaded."""
        self.spec = spec
        self.adapter.spec = spec
        for batcher in self.batchers.values():
            batcher.profile = spec.profile

    def batcher(self, op: str, lora: str, batch_lane: bool = False) -> Batcher[Unit]:
        key = BatcherKey(op, lora, batch_lane)
        batcher = self.batchers.get(key)
        if batcher is None:
            batcher = self.batchers[key] = Batcher(self.spec.profile, self._clock)
        return batcher

    @property
    def queued(self) -> int:
        return sum(len(b) for b in self.batchers.values()) + len(self.waiting)

    @property
    def interactive_queued(self) -> int:
        """Interactive units pending here (and jobs waiting for the model to load)."""
        pending = sum(len(b) for key, b in self.batchers.items() if not key.batch_lane)
        return pending + sum(1 for held in self.waiting if not held.batch_lane)

    def batch_queued(self) -> int:
        return sum(len(b) for key, b in self.batchers.items() if key.batch_lane)

    @property
    def busy(self) -> bool:
        """Work is waiting, queued or running on this model: it must not be evicted."""
        return self.running > 0 or self.queued > 0 or self.state == "loading"
