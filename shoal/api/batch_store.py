"""Batch records in a JetStream key-value bucket, changed only by compare-and-set.

A record is the public `Batch` plus what runners coordinate on: which runner holds the
lease on it and until when, and an epoch bumped at every claim. Every runner write checks
it still holds the lease, so a runner that lost its batch (it stalled, another took over)
can never overwrite the new owner's progress.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from ..compat.errors import NotFoundError
from ..compat.openai.batches import FINAL_STATES, Batch, BatchList
from ..queue.errors import KeyConflictError
from ..queue.nats import NatsKeyValue
from .files import valid_id

__all__ = ["BatchRecord", "BatchStore", "LeaseLostError"]


class BatchRecord(msgspec.Struct, kw_only=True):
    """A stored batch: the public `Batch`, its creator and the lease runners share."""

    batch: Batch
    owner: str = ""
    """The runner holding the lease ("" when none)."""
    lease_until: float = 0.0
    epoch: int = 0
    """Claims so far; part names carry it so two owners never write the same part."""
    creator: str = ""
    """The name of the API key that created it ("" without keys): it owns the batch and
    its output files, and the lines run with that key's model allowlist."""

    @property
    def final(self) -> bool:
        return self.batch.status in FINAL_STATES

    def claimable(self, now: float) -> bool:
        return not self.final and (not self.owner or self.lease_until < now)


def _within(record: BatchRecord, scope: str | None) -> bool:
    return scope is None or record.creator == scope


class LeaseLostError(Exception):
    """Another runner holds this batch now."""


_decode = msgspec.json.Decoder(BatchRecord).decode
_encode = msgspec.json.Encoder().encode


class BatchStore:
    """Batch records by id. Reading methods take `scope`: the creator whose batches the
    caller may see (None: every batch); another's batch is "not found", as a missing one."""

    def __init__(self, kv: NatsKeyValue) -> None:
        self._kv = kv

    async def create(self, record: BatchRecord) -> None:
        await self._kv.create(record.batch.id, _encode(record))

    async def get(self, batch_id: str, scope: str | None = None) -> BatchRecord:
        """Raises NotFoundError (also for a batch outside `scope`)."""
        entry = await self._read(batch_id)
        if entry is None or not _within(entry[0], scope):
            raise NotFoundError(f"No such batch: '{batch_id}'", param="batch_id")
        return entry[0]

    async def _read(self, batch_id: str) -> tuple[BatchRecord, int] | None:
        if not valid_id(batch_id):
            return None
        entry = await self._kv.get(batch_id)
        return None if entry is None else (_decode(entry[0]), entry[1])

    async def ids(self) -> list[str]:
        return sorted(await self._kv.keys())

    async def change(
        self,
        batch_id: str,
        mutate: Callable[[BatchRecord], BatchRecord | None],
        owner: str | None = None,
    ) -> BatchRecord:
        """Apply `mutate` (None: no change) by compare-and-set, retrying on conflicts.
        With `owner`, the change applies only while that runner holds the lease.

        Raises:
            NotFoundError: no such batch.
            LeaseLostError: `owner` no longer holds it.
        """
        while True:
            entry = await self._read(batch_id)
            if entry is None:
                raise NotFoundError(f"No such batch: '{batch_id}'", param="batch_id")
            record, revision = entry
            if owner is not None and record.owner != owner:
                raise LeaseLostError(batch_id)
            changed = mutate(record)
            if changed is None:
                return record
            try:
                await self._kv.update(batch_id, _encode(changed), revision)
                return changed
            except KeyConflictError:
                continue

    async def claim(self, batch_id: str, owner: str, lease: float) -> BatchRecord | None:
        """Take the lease if the batch is unfinished and nobody holds it; None if not."""
        entry = await self._read(batch_id)
        if entry is None:
            return None
        record, revision = entry
        now = time.time()
        if not record.claimable(now):
            return None
        claimed = msgspec.structs.replace(
            record, owner=owner, lease_until=now + lease, epoch=record.epoch + 1
        )
        try:
            await self._kv.update(batch_id, _encode(claimed), revision)
        except KeyConflictError:
            return None
        return claimed

    async def list(self, limit: int = 20, after: str = "", scope: str | None = None) -> BatchList:
        """Newest first (ids sort by creation time), OpenAI's cursor pagination, over the
        batches within `scope`."""
        ids = sorted(await self._kv.keys(), reverse=True)
        if after:
            ids = [i for i in ids if i < after]
        page: list[Batch] = []
        has_more = False
        for batch_id in ids:
            entry = await self._read(batch_id)
            if entry is None or not _within(entry[0], scope):
                continue
            if len(page) == limit:
                has_more = True
                break
            page.append(entry[0].batch)
        return BatchList(
            data=page,
            has_more=has_more,
            first_id=page[0].id if page else None,
            last_id=page[-1].id if page else None,
        )
