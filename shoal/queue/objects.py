"""The object store: uploaded files, batch outputs and (later) offloaded payloads.

One small async interface, two backends:

- `LocalObjectStore`: a directory (the embedded default: no extra server). Writes go to
  a temporary file renamed into place, so a reader never sees half an object.
- `S3ObjectStore`: any S3-compatible service through boto3. Large writes are multipart
  uploads of `part_bytes` parts, so memory stays bounded whatever the object's size.

Both stream: `put` takes an async iterator of chunks and `get` yields chunks. Blocking
calls (file and boto3 I/O) run in worker threads, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import Any, Protocol

from ..config import ObjectStoreSettings, S3Settings
from ..s3 import s3_client

__all__ = [
    "LocalObjectStore",
    "ObjectNotFoundError",
    "ObjectStore",
    "ObjectStoreError",
    "S3ObjectStore",
    "open_object_store",
]

CHUNK = 1 << 20


class ObjectStoreError(Exception):
    """The store could not be read or written (unreachable, denied, disk full)."""


class ObjectNotFoundError(ObjectStoreError):
    """No object under that key."""


class ObjectStore(Protocol):
    """Files, batch parts and offloaded payloads: a directory or an S3 bucket."""

    async def put(self, key: str, chunks: AsyncIterable[bytes]) -> int:
        """Store the concatenated chunks under `key` (replacing it); returns its size."""
        ...

    async def put_bytes(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> AsyncIterator[bytes]:
        """The object's bytes in chunks. Raises ObjectNotFoundError on first iteration."""
        ...

    async def get_bytes(self, key: str) -> bytes: ...

    async def delete(self, key: str) -> None:
        """Remove `key`; a missing key is not an error."""
        ...

    async def list(self, prefix: str) -> list[str]:
        """Keys under `prefix`, sorted."""
        ...


async def _collect(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


class LocalObjectStore:
    """An object store in a local directory (one machine)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise ObjectStoreError(f"key {key!r} leaves the store")
        return path

    async def put(self, key: str, chunks: AsyncIterable[bytes]) -> int:
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
        try:
            await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
            size = 0
            with open(tmp, "wb") as out:  # noqa: ASYNC230 - every write runs in a thread
                async for chunk in chunks:
                    await asyncio.to_thread(out.write, chunk)
                    size += len(chunk)
            await asyncio.to_thread(os.replace, tmp, path)
            return size
        except OSError as exc:
            raise ObjectStoreError(f"writing {key!r} failed: {exc}") from exc
        finally:
            with contextlib.suppress(OSError):  # gone, or its directory never was made
                tmp.unlink()

    async def put_bytes(self, key: str, data: bytes) -> None:
        await self.put(key, _one(data))

    async def get(self, key: str) -> AsyncIterator[bytes]:
        path = self._path(key)
        try:
            handle = open(path, "rb")  # noqa: ASYNC230, SIM115 - reads run in a thread
        except FileNotFoundError:
            raise ObjectNotFoundError(key) from None
        except OSError as exc:
            raise ObjectStoreError(f"reading {key!r} failed: {exc}") from exc
        with handle:
            while chunk := await asyncio.to_thread(handle.read, CHUNK):
                yield chunk

    async def get_bytes(self, key: str) -> bytes:
        return await _collect(self.get(key))

    async def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(self._path(key).unlink)

    async def list(self, prefix: str) -> list[str]:
        def scan() -> list[str]:
            base = self.root
            if not base.exists():
                return []
            keys = (
                p.relative_to(base).as_posix()
                for p in base.rglob("*")
                if p.is_file() and not p.name.startswith(".")
            )
            return sorted(k for k in keys if k.startswith(prefix))

        return await asyncio.to_thread(scan)


class S3ObjectStore:
    """An object store in an S3 bucket (shared by every process)."""

    def __init__(
        self, s3: S3Settings, bucket: str, prefix: str = "", part_bytes: int = 8 << 20
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.part_bytes = max(part_bytes, 5 << 20)  # S3's smallest part but the last
        self._s3 = s3
        self._client_instance: Any = None
        self._bucket_checked = False

    def _client(self) -> Any:
        if self._client_instance is None:
            self._client_instance = s3_client(self._s3, read_timeout=60.0)
        return self._client_instance

    async def _call(self, method: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        def call() -> Any:
            return getattr(self._client(), method)(**kwargs)

        try:
            return await asyncio.to_thread(call)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise ObjectNotFoundError(kwargs.get("Key", "")) from None
            raise ObjectStoreError(f"S3 {method} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise ObjectStoreError(f"S3 {method} failed: {exc}") from exc

    async def _ensure_bucket(self) -> None:
        if self._bucket_checked:
            return
        try:
            await self._call("head_bucket", Bucket=self.bucket)
        except ObjectStoreError:
            with contextlib.suppress(ObjectStoreError):  # created meanwhile elsewhere
                await self._call("create_bucket", Bucket=self.bucket)
            await self._call("head_bucket", Bucket=self.bucket)
        self._bucket_checked = True

    async def put(self, key: str, chunks: AsyncIterable[bytes]) -> int:
        await self._ensure_bucket()
        full = self.prefix + key
        buffer = bytearray()
        size = 0
        upload_id = ""
        parts: list[dict[str, Any]] = []
        try:
            async for chunk in chunks:
                buffer += chunk
                size += len(chunk)
                if len(buffer) >= self.part_bytes:
                    if not upload_id:
                        created = await self._call(
                            "create_multipart_upload", Bucket=self.bucket, Key=full
                        )
                        upload_id = created["UploadId"]
                    part = await self._call(
                        "upload_part",
                        Bucket=self.bucket,
                        Key=full,
                        UploadId=upload_id,
                        PartNumber=len(parts) + 1,
                        Body=bytes(buffer),
                    )
                    parts.append({"ETag": part["ETag"], "PartNumber": len(parts) + 1})
                    buffer.clear()
            if not upload_id:
                await self._call("put_object", Bucket=self.bucket, Key=full, Body=bytes(buffer))
                return size
            if buffer:
                part = await self._call(
                    "upload_part",
                    Bucket=self.bucket,
                    Key=full,
                    UploadId=upload_id,
                    PartNumber=len(parts) + 1,
                    Body=bytes(buffer),
                )
                parts.append({"ETag": part["ETag"], "PartNumber": len(parts) + 1})
            await self._call(
                "complete_multipart_upload",
                Bucket=self.bucket,
                Key=full,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )
            return size
        except BaseException:
            if upload_id:
                with contextlib.suppress(Exception):
                    await self._call(
                        "abort_multipart_upload", Bucket=self.bucket, Key=full, UploadId=upload_id
                    )
            raise

    async def put_bytes(self, key: str, data: bytes) -> None:
        await self.put(key, _one(data))

    async def get(self, key: str) -> AsyncIterator[bytes]:
        await self._ensure_bucket()
        response = await self._call("get_object", Bucket=self.bucket, Key=self.prefix + key)
        body = response["Body"]
        try:
            while chunk := await asyncio.to_thread(body.read, CHUNK):
                yield chunk
        finally:
            body.close()

    async def get_bytes(self, key: str) -> bytes:
        return await _collect(self.get(key))

    async def delete(self, key: str) -> None:
        await self._ensure_bucket()
        await self._call("delete_object", Bucket=self.bucket, Key=self.prefix + key)

    async def list(self, prefix: str) -> list[str]:
        await self._ensure_bucket()
        keys: list[str] = []
        token = ""
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix}
            if token:
                kwargs["ContinuationToken"] = token
            page = await self._call("list_objects_v2", **kwargs)
            keys.extend(obj["Key"][len(self.prefix) :] for obj in page.get("Contents", []))
            if not page.get("IsTruncated"):
                return sorted(keys)
            token = page["NextContinuationToken"]


def open_object_store(settings: ObjectStoreSettings, s3: S3Settings, data_dir: str) -> ObjectStore:
    """The store the settings pick: `local` (under `data_dir/objects` by default) or `s3`."""
    if settings.backend == "s3":
        return S3ObjectStore(s3, settings.bucket, settings.prefix)
    return LocalObjectStore(settings.local_dir or Path(data_dir) / "objects")
