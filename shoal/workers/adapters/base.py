"""The encoder adapter interface: what the pull loop needs from a model family.

An adapter tokenizes (any thread), embeds a batch of token-id rows (the one forward
thread), and says how long each input was so the loop can cost and truncate it. Each
family lives in its own module; `DummyAdapter` serves tests without torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from ...model_registry import ModelSpec

__all__ = ["EncoderAdapter", "Tokenized"]


class Tokenized:
    """One input as token ids, with its length before truncation."""

    __slots__ = ("full_length", "ids")

    def __init__(self, ids: np.ndarray, full_length: int) -> None:
        self.ids = ids
        self.full_length = full_length

    @property
    def truncated(self) -> bool:
        return self.full_length > len(self.ids)


class EncoderAdapter(ABC):
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec

    @property
    def max_length(self) -> int:
        return self.spec.max_length

    @property
    def dims(self) -> int:
        return self.spec.dims

    @abstractmethod
    def load(self) -> None:
        """Load weights; called once, off the event loop."""

    def warmup(self) -> None:
        """Run one small batch so the first request does not pay for lazy initialisation."""
        self.embed(self.tokenize(["warm up"]))

    @abstractmethod
    def tokenize(self, texts: Sequence[str]) -> list[Tokenized]:
        """Token ids per text, special tokens included, cut to `max_length`."""

    @abstractmethod
    def prepare_ids(self, token_ids: Sequence[Sequence[int]]) -> list[Tokenized]:
        """Caller-tokenized inputs with special tokens added, cut to `max_length`.

        Raises:
            ValueError: an id outside the vocabulary.
        """

    @abstractmethod
    def embed(self, batch: Sequence[Tokenized]) -> np.ndarray:
        """float32 `(len(batch), dims)`, as the model's own pipeline would give."""

    def unload(self) -> None:  # noqa: B027 - optional hook
        """Free what `load` took."""
