"""The work stream's and consumers' configuration, derived from settings.

Streams and consumers are created explicitly and reconciled at start-up by every process
that uses them (gateways create the stream, workers create their consumers), never
implicitly by a subscribe call, so a changed setting takes effect instead of drifting.
"""

from __future__ import annotations

from typing import Any

from ..config import NatsSettings
from .dead_letters import dead_letter_stream_config
from .nats import Bus
from .subjects import Lane, Subjects

__all__ = ["consumer_config", "ensure_consumer", "ensure_work_stream", "work_stream_config"]


def work_stream_config(settings: NatsSettings, subjects: Subjects) -> dict[str, Any]:
    """WorkQueue retention (an item is gone once acked), bounded with `discard: new` so a
    full queue refuses new work at once instead of silently dropping old work."""
    return {
        "name": settings.stream,
        "subjects": [subjects.all_work],
        "retention": "workqueue",
        "discard": "new",
        "max_msgs": settings.max_msgs,
        "max_bytes": settings.max_bytes,
        "max_age": settings.max_age,
        "storage": settings.storage,
        "num_replicas": settings.replicas,
        "duplicate_window": settings.duplicate_window,
    }


def consumer_config(
    settings: NatsSettings, subjects: Subjects, lane: Lane, model_id: str
) -> dict[str, Any]:
    """One durable pull consumer per (lane, model), shared by every worker serving it."""
    name = subjects.consumer(lane, model_id)
    return {
        "name": name,
        "durable_name": name,
        "filter_subject": subjects.work_filter(lane, model_id),
        "ack_policy": "explicit",
        "deliver_policy": "all",
        "ack_wait": settings.ack_wait,
        "max_deliver": settings.max_deliver,
        # Several workers each hold up to max_held_jobs; this only bounds the total.
        "max_ack_pending": 100_000,
        "max_waiting": 4096,
    }


async def ensure_work_stream(bus: Bus, settings: NatsSettings, subjects: Subjects) -> None:
    """The work stream, and the dead-letter stream beside it."""
    await bus.ensure_stream(work_stream_config(settings, subjects))
    await bus.ensure_stream(dead_letter_stream_config(settings, subjects))


async def ensure_consumer(
    bus: Bus, settings: NatsSettings, subjects: Subjects, lane: Lane, model_id: str
) -> str:
    """Create or reconcile the consumer; returns its name."""
    config = consumer_config(settings, subjects, lane, model_id)
    await bus.ensure_consumer(settings.stream, config)
    return config["name"]
