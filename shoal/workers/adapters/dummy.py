"""A deterministic stand-in encoder for tests that exercise the loop, not a model.

Tokens are whitespace words hashed into a small vocabulary; a text's vector is the
normalized sum of fixed random vectors of its tokens, so equal texts give equal vectors
and the result is checkable without torch.

A source `sleep:BASE,ROW,TOKEN` (milliseconds) also makes each forward pass take
`BASE + ROW * rows + TOKEN * rows * longest`, sleeping: a stand-in for a model's measured
service time, so that many workers fit on a few cores (perf/scale validates its
simulator with them).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence

import numpy as np

from ...model_registry import ModelSpec
from ...queue.messages import EmbedJob, Job
from .base import EncoderAdapter, Tokenized

__all__ = ["DummyAdapter"]

_VOCAB = 4096
_CLS, _SEP = 1, 2


class DummyAdapter(EncoderAdapter):
    """A deterministic stand-in model for tests: vectors from token ids, no weights."""

    ops = frozenset({"embed"})

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self._table = np.random.default_rng(0).standard_normal((_VOCAB, spec.dims)).astype("f4")
        self.batches: list[int] = []
        """Sizes of the batches embedded, for tests to check batching."""
        self._curve = _sleep_curve(spec.source)

    def load(self, path: str) -> None:
        pass

    def memory_bytes(self) -> int:
        return self._table.nbytes

    def warmup(self) -> None:
        self.embed(self.tokenize(["warm up"]))

    def units(self, job: Job) -> list[Tokenized]:
        if not isinstance(job, EmbedJob):
            raise ValueError("the dummy model only embeds")
        return self.prepare_ids(job.token_ids) if job.token_ids else self.tokenize(job.texts)

    def forward(self, op: str, batch: Sequence[Tokenized]) -> np.ndarray:
        return self.embed(batch)

    def tokenize(self, texts: Sequence[str]) -> list[Tokenized]:
        return self.prepare_ids(
            [[3 + zlib.crc32(w.encode()) % (_VOCAB - 3) for w in t.split()] for t in texts]
        )

    def prepare_ids(self, token_ids: Sequence[Sequence[int]]) -> list[Tokenized]:
        out = []
        for ids in token_ids:
            if any(not 0 <= i < _VOCAB for i in ids):
                raise ValueError(f"token ids must be in [0, {_VOCAB})")
            full = [_CLS, *ids, _SEP]
            kept = [*full[: self.max_length - 1], _SEP] if len(full) > self.max_length else full
            out.append(Tokenized(np.asarray(kept, dtype=np.int64), len(full)))
        return out

    def embed(self, batch: Sequence[Tokenized]) -> np.ndarray:
        self.batches.append(len(batch))
        if self._curve:
            base, row, token = self._curve
            longest = max(len(t.ids) for t in batch)
            time.sleep((base + row * len(batch) + token * len(batch) * longest) / 1000)
        vectors = np.stack([self._table[t.ids].sum(axis=0) for t in batch])
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _sleep_curve(source: str) -> tuple[float, float, float] | None:
    """(base, per row, per padded token) milliseconds from a `sleep:B,R,T` source."""
    if not source.startswith("sleep:"):
        return None
    base, row, token = (float(x) for x in source.removeprefix("sleep:").split(","))
    return base, row, token
