"""A generation job while a worker holds it (`GenerationHeld`, as encoder/held.py's
`EncoderHeld`: both extend the core's `Held`), the free slots batch work leaves to live
requests (`LiveDemand`), and a traced job's spans."""

from __future__ import annotations

import secrets
import time

from ...queue import Delivery
from ...queue.messages import ChoiceDelta, Job
from ..core import Held
from ..observe import record_job_spans

__all__ = ["GenerationHeld", "LiveDemand", "record_spans"]


class GenerationHeld(Held):
    """A generation job on this worker: its sequences' progress and its stream's state."""

    __slots__ = (
        "attempt",
        "completion_tokens",
        "first_token_at",
        "flushed_at",
        "key",
        "last_token_at",
        "open",
        "pending",
        "prompt_tokens",
        "seq",
    )

    def __init__(self, delivery: Delivery, job: Job, batch_lane: bool) -> None:
        super().__init__(delivery, job, batch_lane)
        self.key = f"{job.request_id}.{secrets.token_hex(3)}"
        self.attempt = secrets.token_hex(6)
        """Names this delivery's stream: the gateway tells a regeneration from a repeat."""
        self.seq = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        n = getattr(job, "n", 1)
        self.open = set(range(job.first_index, job.first_index + n))
        """Choices still generating."""
        self.first_token_at = self.last_token_at = 0.0
        self.pending: list[ChoiceDelta] = []
        """A batch-lane job's deltas not yet published (see worker.py's `BATCH_FLUSH_S`)."""
        self.flushed_at = time.monotonic()


class LiveDemand:
    """How many free slots batch work leaves to live requests: one more than the most live
    sequences running at once in the last `window` seconds, at most `cap` (a quarter of the
    slots; one at least). A fixed quarter (the earlier rule) held 8 of 32 slots idle under a
    batch job with one live stream; this keeps the spare that live traffic has shown it
    needs, and gives the rest back after `window` seconds without it."""

    def __init__(self, cap: int, window: float = 10.0, clock=time.monotonic) -> None:
        self.cap = max(1, cap)
        self.window = window
        self._clock = clock
        self._peak = 0
        self._peak_at = -window

    def note(self, live: int) -> None:
        """`live` sequences run now; called at each admission and each pull."""
        now = self._clock()
        if live >= self._peak or now - self._peak_at > self.window:
            self._peak, self._peak_at = live, now

    def spare(self) -> int:
        return min(self.cap, self._peak + 1)


def record_spans(running: GenerationHeld, model: str) -> None:
    assert running.trace is not None
    job = running.job
    attributes = {"shoal.model": model, "shoal.op": "generate", "shoal.request_id": job.request_id}
    decode = {"shoal.completion_tokens": running.completion_tokens}
    record_job_spans(
        running.trace,
        running.delivery.published_at,
        running.pulled_at,
        running.last_token_at,
        attributes,
        [
            ("shoal.generate.first_token", running.pulled_at, running.first_token_at, {}),
            ("shoal.generate.decode", running.first_token_at, running.last_token_at, decode),
        ],
    )
