"""The encoder adapter interface: what the worker loop needs from a model family.

An adapter turns a job into rows (`units`, on the tokenizer thread), runs a batch of rows
through the model for one op (`forward`, on the single forward thread) and returns one
output array per row. What the rows' outputs mean for a reply is the op's business
(shoal/workers/encoder/results.py). Each family lives in its own module; `DummyAdapter` serves
tests without torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...model_registry import ModelSpec
from ...queue.messages import Job

if TYPE_CHECKING:
    from .lora import LoraSlots

__all__ = ["EncoderAdapter", "Tokenized", "pad_batch"]


class Tokenized:
    """One model row: token ids, and what post-processing needs to know about them."""

    __slots__ = ("full_length", "ids", "offsets", "source", "special", "type_ids")

    def __init__(
        self,
        ids: np.ndarray,
        full_length: int,
        *,
        type_ids: np.ndarray | None = None,
        offsets: np.ndarray | None = None,
        special: np.ndarray | None = None,
        source: int = -1,
    ) -> None:
        self.ids = ids
        self.full_length = full_length
        """Tokens the input had before truncation (special tokens included)."""
        self.type_ids = type_ids
        """Segment ids, for sentence pairs."""
        self.offsets = offsets
        """`(tokens, 2)` character offsets into the input text."""
        self.special = special
        """Boolean mask of special tokens."""
        self.source = source
        """Which input of the job the row belongs to, when one input has several rows
        (a long NER text in windows); -1 means the row's own position."""

    @property
    def truncated(self) -> bool:
        return self.full_length > len(self.ids)


class EncoderAdapter(ABC):
    """One encoder model family: load, tokenize, run a batch, unload."""

    ops: frozenset[str] = frozenset()

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec

    @property
    def max_length(self) -> int:
        return self.spec.max_length

    @property
    def dims(self) -> int:
        return self.spec.dims

    lora: LoraSlots | None = None
    """The model's LoRA adapters, for families that take them (set by `load`)."""

    @abstractmethod
    def load(self, path: str) -> None:
        """Load weights from `path` (a local directory or a hub id), off the event loop."""

    def memory_bytes(self) -> int:
        """Bytes the loaded weights take (0 when unknown)."""
        return 0

    def planned_bytes(self, weights: int) -> int:
        """Memory a load of `weights` bytes of weights will take, known before it happens
        (residency plans evictions with it; `memory_bytes` is the truth after)."""
        return weights

    def engine(self) -> str:
        """What runs the loaded model and in which precision (`torch float32`), for
        heartbeats and `/v1/models`."""
        return self.spec.runtime

    def runs_side_by_side(self, op: str, lora: str) -> bool:
        """Whether a pass of `op` (with LoRA adapter `lora`, "" for none) may run beside
        another pass on a second forward thread: only in an engine made for it (torch sets
        its thread count for the whole process)."""
        return False

    @abstractmethod
    def warmup(self) -> None:
        """Run one small batch per op so the first request pays no lazy initialisation."""

    @abstractmethod
    def units(self, job: Job) -> list[Tokenized]:
        """The rows `job` needs run, in order.

        Raises:
            ValueError: inputs the model cannot take (token ids outside the vocabulary).
        """

    @abstractmethod
    def forward(self, op: str, batch: Sequence[Tokenized]) -> Sequence[np.ndarray]:
        """One float32 output per row: a vector (embed, classify, rerank) or a
        `(tokens, k)` matrix (multivector, ner)."""

    def unload(self) -> None:  # noqa: B027 - optional hook
        """Free what `load` took."""


def pad_batch(
    batch: Sequence[Tokenized], pad_id: int, left: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(ids, attention_mask, type_ids)`, each `(rows, longest row)` int64."""
    rows = len(batch)
    width = max(len(t.ids) for t in batch)
    ids = np.full((rows, width), pad_id, dtype=np.int64)
    mask = np.zeros((rows, width), dtype=np.int64)
    types = np.zeros((rows, width), dtype=np.int64)
    for i, tok in enumerate(batch):
        n = len(tok.ids)
        span = slice(width - n, width) if left else slice(0, n)
        ids[i, span] = tok.ids
        mask[i, span] = 1
        if tok.type_ids is not None:
            types[i, span] = tok.type_ids
    return ids, mask, types
