"""An encoder job while a worker holds it: its rows as batcher units, their outputs."""

from __future__ import annotations

import time

import numpy as np

from ...queue.messages import Job
from ...queue.source import Delivery
from ..adapters.base import Tokenized
from ..core import Held

__all__ = ["EncoderHeld", "Unit", "jobs_of"]


class Unit:
    """One row of a held job: what the batcher orders and the model runs."""

    __slots__ = ("held", "row", "tok")

    def __init__(self, held: EncoderHeld, row: int, tok: Tokenized) -> None:
        self.held = held
        self.row = row
        self.tok = tok

    @property
    def cost(self) -> int:
        return len(self.tok.ids)


class EncoderHeld(Held):
    """An encoder job in a worker: its rows and their outputs."""

    __slots__ = (
        "batch_seen",
        "forward_ended",
        "forward_started",
        "outputs",
        "prompt_tokens",
        "queued_at",
        "remaining",
        "tokens",
    )

    def __init__(self, delivery: Delivery, job: Job, batch_lane: bool = False) -> None:
        super().__init__(delivery, job, batch_lane)
        self.tokens: list[Tokenized] = []
        self.outputs: list[np.ndarray] = []
        self.remaining = 0
        self.prompt_tokens = 0
        self.queued_at = self.forward_started = self.forward_ended = 0.0
        self.batch_seen = (0, 0)
        """Inputs and padded tokens of the last batch it ran in (traced jobs only)."""

    def start(self, tokens: list[Tokenized]) -> list[Unit]:
        """The job's batcher units; their outputs are filled in as batches finish."""
        self.tokens = tokens
        self.queued_at = time.time()
        self.remaining = len(tokens)
        self.prompt_tokens = sum(len(t.ids) for t in tokens)
        self.outputs = [None] * len(tokens)  # type: ignore[list-item]
        return [Unit(self, row, tok) for row, tok in enumerate(tokens)]

    def fill(self, row: int, output: np.ndarray) -> bool:
        """Store one row's output; True when the job has all of them."""
        self.outputs[row] = output
        self.remaining -= 1
        return self.remaining == 0


def jobs_of(units: list[Unit]) -> list[EncoderHeld]:
    """The jobs `units` belong to, each once, in order."""
    return list({id(u.held): u.held for u in units}.values())
