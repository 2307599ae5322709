"""Storage quotas: how many bytes of files one API key, and all keys together, may store.

What is stored is read from the files bucket (each file's record names its owner and
size), which every gateway shares and which outlives any of them, so the quota holds
across restarts and across gateways. Every file a key owns counts, batch outputs
included: they take the same disk as uploads, and an embeddings batch's output is many
times its input. Outputs are still always written (the work is done; dropping it would
waste it), so a key can end up past its quota; it then uploads nothing and creates no
batch until it deletes files.

An upload is counted as its bytes arrive and refused once it passes what is left, so
nothing over the quota is read into the store. Uploads in flight on this gateway count
too, so two at once cannot both take the last room; uploads in flight on another gateway
are seen only once they are recorded, so gateways uploading for one key at the same
moment can together pass its quota by what they have in flight (the race accepted for
not coordinating every chunk through NATS).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import NamedTuple

from ..compat.errors import PayloadTooLargeError

__all__ = ["StorageQuota", "StorageQuotaError", "StoredBytes"]


class StorageQuotaError(PayloadTooLargeError):
    """413: what is stored leaves no room for this; deleting files makes room (so it is
    not a 429: waiting alone frees nothing)."""

    code = "storage_quota_exceeded"


class StoredBytes(NamedTuple):
    by_owner: dict[str, int]
    """Bytes of files per owning key name ("" for files made without keys)."""
    total: int


class _Upload:
    """One upload in flight on this gateway."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.sent = 0
        self.stored = StoredBytes({}, 0)
        """The bucket as read when the upload began."""
        self.since_owner = 0
        self.since_total = 0
        """Bytes of uploads recorded since it was read (they may be missing from it)."""


class StorageQuota:
    """The per-key and total quotas, checked against the files bucket (`stored`)."""

    def __init__(
        self, per_key: int, total: int, stored: Callable[[], Awaitable[StoredBytes]]
    ) -> None:
        self.per_key = per_key
        self.total = total
        self._stored = stored
        self._uploads: list[_Upload] = []

    async def check_room(self, owner: str) -> None:
        """Refuse work whose output `owner` would store (a batch) when it has no room.

        Raises:
            StorageQuotaError: `owner`'s files, or all files, fill their quota.
        """
        stored = await self._stored()
        mine = stored.by_owner.get(owner, 0)
        if mine >= self.per_key:
            raise StorageQuotaError(
                f"{_whose(owner)} take {mine} bytes, the whole storage quota of "
                f"{self.per_key} bytes per key, and a batch's output is stored too; "
                "delete files to make room"
            )
        if stored.total >= self.total:
            raise StorageQuotaError(
                f"The files stored take the whole total storage quota of {self.total} "
                "bytes, and a batch's output is stored too; delete files to make room"
            )

    @contextlib.asynccontextmanager
    async def upload(
        self, owner: str
    ) -> AsyncIterator[Callable[[AsyncIterable[bytes]], AsyncIterator[bytes]]]:
        """Around storing one file for `owner`, until its record is written: gives a
        wrapper for its chunks that raises StorageQuotaError once they pass the room
        left."""
        upload = _Upload(owner)
        self._uploads.append(upload)  # before reading the bucket: see `_Upload.since_*`
        try:
            upload.stored = await self._stored()
            yield lambda chunks: self._metered(upload, chunks)
            for other in self._uploads:  # recorded now: count it for those that began
                if other is not upload:
                    other.since_total += upload.sent
                    if other.owner == owner:
                        other.since_owner += upload.sent
        finally:
            self._uploads.remove(upload)

    async def _metered(self, upload: _Upload, chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
        async for chunk in chunks:
            upload.sent += len(chunk)
            self._check(upload)
            yield chunk

    def _check(self, upload: _Upload) -> None:
        owner = upload.owner
        in_flight = sum(u.sent for u in self._uploads)
        mine = sum(u.sent for u in self._uploads if u.owner == owner)
        stored = upload.stored.by_owner.get(owner, 0) + upload.since_owner
        if stored + mine > self.per_key:
            raise StorageQuotaError(
                f"This file does not fit in the storage quota of {self.per_key} bytes per "
                f"key: {_whose(owner)} take {stored} bytes; delete files to make room",
                param="file",
            )
        if upload.stored.total + upload.since_total + in_flight > self.total:
            raise StorageQuotaError(
                f"This file does not fit in the total storage quota of {self.total} bytes; "
                "delete files to make room",
                param="file",
            )


def _whose(owner: str) -> str:
    return f"The files of API key '{owner}'" if owner else "The files stored without a key"
