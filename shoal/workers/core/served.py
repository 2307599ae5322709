"""What the worker core keeps per served model (`Served`: its spec, its two lanes' sources
and pull tasks), and how it tells the queue what became of a held job."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ...model_registry import ModelSpec
from ...queue.source import WorkSource
from .held import Held

__all__ = ["Served", "close_sources", "tell_queue"]

log = logging.getLogger(__name__)


class Served:
    """A model the core serves: its spec and its two lanes' sources and pull tasks."""

    __slots__ = ("batch_source", "pulls", "source", "spec")

    def __init__(self, spec: ModelSpec, source: WorkSource, batch_source: WorkSource) -> None:
        self.spec = spec
        self.source = source
        self.batch_source = batch_source
        """The low-priority batch lane, pulled only into room live work leaves."""
        self.pulls: list[asyncio.Task] = []


async def tell_queue(held: Held, action: str, delay: float) -> None:
    """Ack, term or nak `held` (as its settlement says); a failure is logged: the server
    redelivers it after `ack_wait`."""
    try:
        if action == "ack":
            await held.delivery.ack()
        elif action == "term":
            await held.delivery.term()
        elif action == "nak":
            await held.delivery.nak(delay)
    except Exception as exc:  # the server redelivers it after ack_wait
        log.warning("could not %s %s: %r", action, held.request_id, exc)


async def close_sources(*sources: WorkSource) -> None:
    """Close these lanes' sources (a source that fails to close is let go)."""
    for source in sources:
        with contextlib.suppress(Exception):
            await source.close()
