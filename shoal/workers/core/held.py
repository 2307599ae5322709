"""A job while a worker holds it: its delivery, where it came from, and whether it is
settled. Kinds of workers extend it with what they keep per job."""

from __future__ import annotations

import time

from ...queue.messages import OP_OF_JOB, Job
from ...queue.source import Delivery
from ..observe import job_context

__all__ = ["Held"]


class Held:
    """One held job and its delivery."""

    __slots__ = (
        "batch_lane",
        "delivery",
        "done",
        "job",
        "last_progress",
        "op",
        "pulled_at",
        "settled",
        "trace",
    )

    def __init__(self, delivery: Delivery, job: Job, batch_lane: bool = False) -> None:
        self.delivery = delivery
        self.job = job
        self.op = OP_OF_JOB[type(job)]
        self.batch_lane = batch_lane
        """Pulled from the low-priority batch lane."""
        self.pulled_at = time.time()
        self.last_progress = time.monotonic()
        """When the queue last heard it is alive (`in_progress`), not work progress."""
        self.done = False
        """Released (about to be settled, or settled): the worker drops what is left of
        it."""
        self.settled = False
        """The queue was told (ack, nak or term), or will redeliver it (unsent)."""
        self.trace = job_context(delivery.headers)
        """The trace it continues (None unless tracing)."""

    @property
    def request_id(self) -> str:
        return self.job.request_id
