"""Uploaded files: metadata in a JetStream key-value bucket, bytes in the object store.

Ids sort by creation time (`file-<ns hex><random>`), so listing newest first is a sort of
keys. Batch outputs get ids derived from their batch, so finishing a batch twice (after a
runner restart) writes the same file again instead of a second one.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator

import msgspec

from ..compat.errors import InvalidRequestError, NotFoundError, UnavailableError
from ..compat.openai.files import PURPOSES, FileDeleted, FileList, FileObject
from ..queue.nats import NatsKeyValue
from ..queue.objects import ObjectNotFoundError, ObjectStore, ObjectStoreError
from .file_quota import StorageQuota, StoredBytes

__all__ = ["FileRecord", "FileStore", "new_id", "valid_id"]


class FileRecord(FileObject, kw_only=True):
    """A file as stored: the public object and the API key that owns it."""

    owner: str = ""
    """The name of the key that made it ("" without keys, and for files stored before
    owners were recorded: only admin keys see those once keys are configured)."""

    def public(self) -> FileObject:
        return FileObject(**{f: getattr(self, f) for f in FileObject.__struct_fields__})


class _Size(msgspec.Struct):
    """What the quota reads of a record."""

    bytes: int
    owner: str = ""


_decode = msgspec.json.Decoder(FileRecord).decode
_decode_size = msgspec.json.Decoder(_Size).decode
_encode = msgspec.json.Encoder().encode


def new_id(prefix: str) -> str:
    """A unique id that sorts by creation time."""
    return f"{prefix}{time.time_ns():016x}{secrets.token_hex(4)}"


# The shape of the ids the stores mint (`file-…`, `batch_…`), ASCII only: a key NATS KV
# refuses (str.isalnum takes "é") must be a 404, not an InvalidKeyError.
_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def valid_id(store_id: str) -> bool:
    """Whether `store_id` could be a file or batch id (and so a valid NATS KV key)."""
    return _ID.fullmatch(store_id) is not None


def _object_key(file_id: str) -> str:
    return f"files/{file_id}"


class FileStore:
    """Files by id. Every reading method takes `scope`: the owner whose files the caller
    may see (None: every file). Another owner's file is "not found", exactly as a missing
    one, so ids leak nothing."""

    def __init__(
        self, kv: NatsKeyValue, objects: ObjectStore, quota_per_key: int, quota_total: int
    ) -> None:
        self._kv = kv
        self.objects = objects
        self.quota = StorageQuota(quota_per_key, quota_total, self.stored)

    async def stored(self) -> StoredBytes:
        """Bytes of files per owner and in all, as the bucket (every gateway's) records
        them now: one read of the whole bucket."""
        by_owner: dict[str, int] = {}
        for value in (await self._kv.values()).values():
            size = _decode_size(value)
            by_owner[size.owner] = by_owner.get(size.owner, 0) + size.bytes
        return StoredBytes(by_owner, sum(by_owner.values()))

    async def add(
        self,
        filename: str,
        purpose: str,
        chunks: AsyncIterable[bytes],
        file_id: str = "",
        owner: str = "",
    ) -> FileObject:
        """Stream `chunks` into the store and record the file as `owner`'s.

        Raises:
            UnavailableError: the object store cannot be written.
        """
        if purpose not in PURPOSES:
            raise InvalidRequestError(
                f"'{purpose}' is not a valid purpose; use one of {', '.join(PURPOSES)}",
                param="purpose",
            )
        file_id = file_id or new_id("file-")
        try:
            size = await self.objects.put(_object_key(file_id), chunks)
        except ObjectStoreError as exc:
            raise UnavailableError(f"The file store cannot be written: {exc}") from exc
        record = FileRecord(
            id=file_id,
            bytes=size,
            created_at=int(time.time()),
            filename=filename,
            purpose=purpose,  # type: ignore[arg-type]
            owner=owner,
        )
        await self._kv.put(file_id, _encode(record))
        return record.public()

    async def get(self, file_id: str, scope: str | None = None) -> FileObject:
        """Raises NotFoundError (also for a file outside `scope`)."""
        return (await self._record(file_id, scope)).public()

    async def _record(self, file_id: str, scope: str | None) -> FileRecord:
        entry = await self._kv.get(file_id) if valid_id(file_id) else None
        record = None if entry is None else _decode(entry[0])
        if record is None or (scope is not None and record.owner != scope):
            raise NotFoundError(f"No such file: '{file_id}'", param="file_id")
        return record

    async def list(
        self,
        purpose: str | None = None,
        limit: int = 10_000,
        order: str = "desc",
        after: str = "",
        scope: str | None = None,
    ) -> FileList:
        records: list[FileObject] = []
        for key in await self._kv.keys():
            try:
                records.append(await self.get(key, scope))
            except NotFoundError:  # deleted meanwhile, or another key's
                continue
        records = [r for r in records if purpose is None or r.purpose == purpose]
        records.sort(key=lambda r: (r.created_at, r.id), reverse=order != "asc")
        if after:
            ids = [r.id for r in records]
            records = records[ids.index(after) + 1 :] if after in ids else []
        page = records[:limit]
        return FileList(
            data=page,
            has_more=len(records) > limit,
            first_id=page[0].id if page else None,
            last_id=page[-1].id if page else None,
        )

    async def content(self, file_id: str, scope: str | None = None) -> AsyncIterator[bytes]:
        """The file's bytes, streamed. Raises NotFoundError before the first chunk."""
        await self.get(file_id, scope)
        chunks = self.objects.get(_object_key(file_id))
        try:
            first = await anext(chunks, b"")
        except ObjectNotFoundError:
            raise NotFoundError(f"The content of file '{file_id}' is gone") from None
        except ObjectStoreError as exc:
            raise UnavailableError(f"The file store cannot be read: {exc}") from exc
        return _prepend(first, chunks)

    async def delete(self, file_id: str, scope: str | None = None) -> FileDeleted:
        await self.get(file_id, scope)
        try:
            await self.objects.delete(_object_key(file_id))
        except ObjectStoreError as exc:
            raise UnavailableError(f"The file store cannot be written: {exc}") from exc
        await self._kv.delete(file_id)
        return FileDeleted(id=file_id, deleted=True)


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for chunk in rest:
        yield chunk
