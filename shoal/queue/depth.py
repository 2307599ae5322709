"""Queue depth per work subject, for `/metrics` and the status page.

Each (lane, model) has one durable consumer (see `subjects`): its `num_pending` is work
not yet handed to a worker, `num_ack_pending` work a worker holds now. Read on demand, at
most once a second however often it is asked, so scrapes and status polls cost JetStream
one request between them.
"""

from __future__ import annotations

import logging
import time

import msgspec

from .errors import QueueUnavailableError
from .nats import Bus
from .subjects import Subjects, token_model

__all__ = ["QueueDepth", "QueueDepths"]

log = logging.getLogger(__name__)

_FRESH_FOR = 1.0
"""Seconds a reading is reused."""


class QueueDepth(msgspec.Struct, frozen=True):
    """One work consumer's pending and in-flight items."""

    subject: str
    """The consumer's filter: `{prefix}.work.{lane}.{model}.*`."""
    lane: str
    model: str
    pending: int
    """Waiting for a worker."""
    in_flight: int
    """Held by a worker, not yet acked."""


class QueueDepths:
    """Every work consumer's depth, read from JetStream at most once a second."""

    def __init__(self, bus: Bus, stream: str, subjects: Subjects) -> None:
        self._bus = bus
        self._stream = stream
        self._subjects = subjects
        self._read_at = -_FRESH_FOR
        self.latest: list[QueueDepth] = []
        """The last reading, for synchronous readers (metric callbacks)."""

    async def read(self) -> list[QueueDepth]:
        """The depth of every work consumer (the last reading when NATS is away)."""
        now = time.monotonic()
        if now - self._read_at < _FRESH_FOR:
            return self.latest
        self._read_at = now
        try:
            infos = await self._bus.consumer_states(self._stream)
        except QueueUnavailableError as exc:
            log.debug("queue depth unknown: %r", exc)
            return self.latest
        depths = []
        prefix = f"{self._subjects.prefix}.work."
        for info in infos:
            subject = info.filter_subject
            parts = subject.removeprefix(prefix).split(".")
            if not subject.startswith(prefix) or len(parts) != 3:
                continue  # not one of ours (a consumer someone added by hand)
            depths.append(
                QueueDepth(
                    subject=subject,
                    lane=parts[0],
                    model=token_model(parts[1]),
                    pending=info.pending,
                    in_flight=info.ack_pending,
                )
            )
        self.latest = sorted(depths, key=lambda d: (d.lane != "interactive", d.model))
        return self.latest
