"""A worker's heartbeat: what it serves and how busy it is, on the heartbeat subject every
few seconds; gateways route, report and judge liveness by it. Its evolution rules are the
messages' (messages.py)."""

from __future__ import annotations

from typing import Literal

import msgspec

from .messages import _Wire

__all__ = ["WorkerHeartbeat", "decode_heartbeat"]


class WorkerHeartbeat(_Wire, tag="heartbeat", kw_only=True):
    worker_id: str
    models: list[str]
    """What the worker serves: model ids, or `*` for every registered model."""
    state: Literal["loading", "ready", "stopping"]
    sent_at: float
    resident: list[str] = []
    """Models loaded in memory now."""
    resident_bytes: int = 0
    memory_budget: int = 0
    loads: int = 0
    evictions: int = 0
    batch_max: int = 0
    """Generation: the largest batch one decode step has run."""
    active: int = 0
    """Generation: sequences running or waiting for a slot now."""
    batches_per_s: float = 0.0
    """Forward passes per second over the last few seconds."""
    items_per_s: float = 0.0
    """Inputs run per second (encoders)."""
    tokens_per_s: float = 0.0
    """Tokens run per second (prompt tokens; generated tokens for generation)."""
    batch_fill: float = 0.0
    """Mean share of the token budget its recent batches used (encoders), 0..1."""
    engines: dict[str, str] = {}
    """What runs each resident model and in which precision (`openvino float32`)."""
    forward_busy: float = 0.0
    """Encoders: moving average (about a second) of the share of the forward capacity
    computing, 0..1: near 1, the worker is saturated."""
    passes_side_by_side: int = 0
    """Encoders: forward passes run so far beside another (two engine streams on a CPU,
    under load)."""
    sequences_drafted: int = 0
    """Generation: sequences decoded speculatively so far (alone, a draft model
    proposing tokens the full model checks)."""
    drafted_moved: int = 0
    """Generation: of those, how many moved to the main batch midway (another sequence
    arrived)."""


decode_heartbeat = msgspec.msgpack.Decoder(WorkerHeartbeat).decode
