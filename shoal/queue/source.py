"""What a worker pulls work from: the protocol its loop is written against.

`nats.JetStreamPuller` implements it over a real durable pull consumer; unit tests use an
in-memory source that records how each delivery was settled.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Delivery", "WorkSource"]


class Delivery(Protocol):
    """One delivered work item and the ways to settle it."""

    @property
    def data(self) -> bytes: ...

    @property
    def published_at(self) -> float:
        """Unix time the item entered the queue."""
        ...

    @property
    def num_delivered(self) -> int:
        """1 on the first delivery, more on redeliveries."""
        ...

    @property
    def subject(self) -> str:
        """The work subject it was published to."""
        ...

    @property
    def headers(self) -> dict[str, str] | None:
        """Its message headers (trace context travels here)."""
        ...

    @property
    def stream_seq(self) -> int:
        """Its sequence number in the work stream."""
        ...

    async def ack(self) -> None:
        """Done: remove the item from the queue."""
        ...

    async def nak(self, delay: float = 0.0) -> None:
        """Not now: deliver it again (to any worker) after `delay` seconds."""
        ...

    async def term(self) -> None:
        """Never: drop the item for good (poison)."""
        ...

    async def in_progress(self) -> None:
        """Still working: restart the redelivery timer."""
        ...


class WorkSource(Protocol):
    """Where a worker pulls one model's lane from."""

    async def fetch(self, max_items: int, max_wait: float) -> list[Delivery]:
        """Up to `max_items` deliveries: at once if some are waiting, else the first to
        arrive within `max_wait` seconds; `[]` if none came."""
        ...

    async def close(self) -> None: ...
