"""Admin API schemas: registering models and LoRA adapters at run time, worker status."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from ..model_registry import AdapterSpec, ModelSpec
from ..queue.dead_letters import DeadLetter
from ..queue.heartbeat import WorkerHeartbeat

__all__ = [
    "AdapterRegistration",
    "DeadLetterInfo",
    "DeadLetterList",
    "ModelInfo",
    "ModelInfoList",
    "WorkerInfo",
    "WorkerStatus",
]

RegisteredId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._-]{1,128}$")]


class AdapterRegistration(msgspec.Struct, kw_only=True):
    name: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._-]{1,128}$")]
    source: Annotated[str, msgspec.Meta(min_length=1)]
    """A local path, `s3://bucket/prefix` or `hf:ORG/NAME` holding a peft adapter."""

    def to_spec(self, base: str) -> AdapterSpec:
        return AdapterSpec(name=self.name, base=base, source=self.source)


class ModelInfo(msgspec.Struct):
    spec: ModelSpec
    origin: Literal["spec_file", "registered"]
    adapters: list[AdapterSpec]


class ModelInfoList(msgspec.Struct):
    data: list[ModelInfo]
    object: Literal["list"] = "list"


class WorkerInfo(msgspec.Struct, kw_only=True):
    """A worker as its last heartbeat described it, every field present."""

    worker_id: str
    models: list[str]
    state: str
    sent_at: float
    resident: list[str]
    resident_bytes: int
    memory_budget: int
    loads: int
    evictions: int
    batch_max: int
    active: int
    batches_per_s: float
    items_per_s: float
    tokens_per_s: float
    batch_fill: float
    engines: dict[str, str]
    """What runs each resident model and in which precision."""
    forward_busy: float
    passes_side_by_side: int
    sequences_drafted: int
    drafted_moved: int

    @classmethod
    def of(cls, beat: WorkerHeartbeat) -> WorkerInfo:
        return cls(**msgspec.structs.asdict(beat))


class WorkerStatus(msgspec.Struct):
    workers: list[WorkerInfo]


class DeadLetterInfo(msgspec.Struct, kw_only=True):
    """A work item given up on: what it was for, why, and where it came from."""

    id: int
    """Its sequence in the dead-letter stream."""
    request_id: str
    part: int
    model: str
    op: str
    lane: str
    reason: str
    """`max_deliver` (failed on every delivery), `worker_crashed` (its workers died
    holding it), `undecodable` or `payload_unreadable`."""
    error: str
    deliveries: int
    worker_id: str
    dead_at: float
    work_seq: int
    item_bytes: int
    """Size of the item as it was queued (kept in the stream for replay or study)."""

    @classmethod
    def of(cls, seq: int, letter: DeadLetter) -> DeadLetterInfo:
        fields = msgspec.structs.asdict(letter)
        item = fields.pop("item")
        return cls(id=seq, item_bytes=len(item), **fields)


class DeadLetterList(msgspec.Struct):
    data: list[DeadLetterInfo]
    object: Literal["list"] = "list"
