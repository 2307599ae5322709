"""A work item while a worker holds it: its inputs as batcher units, its output rows."""

from __future__ import annotations

import time

import numpy as np

from ..queue.messages import EmbedJob, EmbedResult
from ..queue.source import Delivery
from .adapters.base import Tokenized

__all__ = ["HeldJob", "Unit", "embed_result"]


class Unit:
    """One input of a held job: what the batcher orders and the model embeds."""

    __slots__ = ("held", "row", "tok")

    def __init__(self, held: HeldJob, row: int, tok: Tokenized) -> None:
        self.held = held
        self.row = row
        self.tok = tok

    @property
    def cost(self) -> int:
        return len(self.tok.ids)


class HeldJob:
    __slots__ = (
        "delivery",
        "done",
        "job",
        "last_progress",
        "prompt_tokens",
        "pulled_at",
        "remaining",
        "vectors",
    )

    def __init__(self, delivery: Delivery, job: EmbedJob) -> None:
        self.delivery = delivery
        self.job = job
        self.pulled_at = time.time()
        self.last_progress = time.monotonic()
        self.vectors: np.ndarray | None = None
        self.remaining = 0
        self.prompt_tokens = 0
        self.done = False
        """Settled (answered, retried or dropped): its remaining units are skipped."""

    def start(self, tokens: list[Tokenized], dims: int) -> list[Unit]:
        """The job's batcher units; its output rows are filled in as batches finish."""
        self.remaining = len(tokens)
        self.prompt_tokens = sum(len(t.ids) for t in tokens)
        self.vectors = np.empty((len(tokens), dims), dtype=np.float32)
        return [Unit(self, row, tok) for row, tok in enumerate(tokens)]

    def fill(self, row: int, vector: np.ndarray) -> bool:
        """Store one output row; True when the job has all of them."""
        assert self.vectors is not None
        self.vectors[row] = vector
        self.remaining -= 1
        return self.remaining == 0


def embed_result(held: HeldJob, normalize: bool) -> EmbedResult:
    """The job's reply: `dimensions` applied (re-normalized), cast to the asked dtype."""
    job = held.job
    vectors = held.vectors
    assert vectors is not None
    if job.dimensions and job.dimensions < vectors.shape[1]:
        vectors = vectors[:, : job.dimensions]
        if normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.maximum(norms, 1e-12)
    dtype = "<f2" if job.dtype == "float16" else "<f4"
    data = np.ascontiguousarray(vectors, dtype=dtype).tobytes()
    now = time.time()
    return EmbedResult(
        request_id=job.request_id,
        part=job.part,
        data=data,
        rows=vectors.shape[0],
        dims=vectors.shape[1],
        dtype=job.dtype,
        prompt_tokens=held.prompt_tokens,
        queue_ms=max(0.0, (held.pulled_at - held.delivery.published_at) * 1000),
        inference_ms=(now - held.pulled_at) * 1000,
    )
