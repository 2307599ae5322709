"""A JetStream key-value bucket as the registry's, the files' and the batches' store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api

from ..errors import KeyConflictError, QueueUnavailableError
from .provisioning import provisioning

__all__ = ["NatsKeyValue"]

log = logging.getLogger(__name__)

_KEYS_FETCH = 1000
_KEYS_FETCH_S = 5.0
_KEYS_CONSUMER_IDLE_S = 30.0


def _holds_value(msg: Msg) -> bool:
    """Whether a key-value message is a value, not a delete, purge or expiry marker."""
    headers = msg.headers or {}
    return (
        headers.get("KV-Operation") not in ("DEL", "PURGE") and "Nats-Marker-Reason" not in headers
    )


class NatsKeyValue:
    """A JetStream key-value bucket as the registry's `KeyValueStore`."""

    def __init__(self, kv: Any, js: Any, bucket: str, ready_within: float) -> None:
        self._kv = kv
        self._js = js
        self._bucket = bucket
        self._ready_within = ready_within
        self._watch_task: asyncio.Task | None = None

    async def put(self, key: str, value: bytes) -> int:
        """Set `key`; returns the new revision."""
        return await self._kv.put(key, value)

    async def get(self, key: str) -> tuple[bytes, int] | None:
        """The value and its revision, or None when missing or deleted."""
        try:
            entry = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        return entry.value or b"", entry.revision

    async def create(self, key: str, value: bytes) -> int:
        """Set `key` only if it does not exist; returns the revision.

        Raises:
            KeyConflictError: it exists.
        """
        try:
            return await self._kv.create(key, value)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise KeyConflictError(key) from exc

    async def update(self, key: str, value: bytes, revision: int) -> int:
        """Set `key` only if its revision is still `revision` (compare and set); returns
        the new revision.

        Raises:
            KeyConflictError: someone else changed it meanwhile.
        """
        try:
            return await self._kv.update(key, value, last=revision)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.APIError) as exc:
            if isinstance(exc, nats.js.errors.KeyWrongLastSequenceError) or exc.err_code == 10071:
                raise KeyConflictError(key) from exc
            raise

    async def keys(self) -> list[str]:
        """Every key that holds a value.

        Not nats-py's `KeyValue.keys()`: its watcher can mark "no more keys" before it has
        counted the entries already in flight, and so answer none while keys exist (seen
        as an empty files list in CI). A pull consumer of the last message per key reads
        until each message says nothing is left.
        """
        return list(await self._last_per_key(headers_only=True))

    async def values(self) -> dict[str, bytes]:
        """Every key that holds a value, with its value: one pass over the bucket (as
        `keys()` reads it), not a request per key."""
        return await self._last_per_key(headers_only=False)

    async def _last_per_key(self, headers_only: bool) -> dict[str, bytes]:
        prefix, stream = f"$KV.{self._bucket}.", f"KV_{self._bucket}"
        sub = await self._js.pull_subscribe(
            f"{prefix}>",
            stream=stream,
            config=api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
                ack_policy=api.AckPolicy.NONE,
                headers_only=headers_only,
                mem_storage=True,
                inactive_threshold=_KEYS_CONSUMER_IDLE_S,
            ),
        )
        entries: dict[str, bytes] = {}
        consumer = ""
        try:
            info = await sub.consumer_info()
            consumer, pending = info.name, info.num_pending
            while pending:
                for msg in await sub.fetch(min(pending, _KEYS_FETCH), timeout=_KEYS_FETCH_S):
                    pending = msg.metadata.num_pending
                    if _holds_value(msg):
                        entries[msg.subject[len(prefix) :]] = msg.data
        except nats.errors.TimeoutError as exc:
            raise QueueUnavailableError(f"listing {self._bucket} timed out") from exc
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
            # Unsubscribing leaves the ephemeral consumer on the server until it idles
            # out, and a burst of listings would reach the server's consumer limit.
            if consumer:
                with contextlib.suppress(nats.errors.Error):
                    await self._js.delete_consumer(stream, consumer)
        return entries

    async def delete(self, key: str) -> None:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await self._kv.delete(key)

    async def watch(self, on_change: Callable[[str, bytes | None], None]) -> None:
        """Call `on_change(key, value)` for every current entry, return, then keep calling
        it for every change (`None` for a deletion) until `close()`."""
        # The current entries end at the stream's last message (the last of its key, so
        # it is delivered). nats-py's own end-of-current-entries marker can come before
        # entries already in flight, as in `keys()`: it is not waited for.
        # Retried as provisioning is: a cluster can still answer "not found" for a
        # bucket just made, by this process or another.
        last, watcher = await provisioning(
            f"bucket {self._bucket}", self._open_watch, self._ready_within
        )
        while last:
            entry = await watcher.updates(timeout=30.0)
            if entry is not None:
                _deliver(entry, on_change)
                if entry.revision >= last:
                    break

        async def follow() -> None:
            async for entry in watcher:
                if entry is not None:
                    _deliver(entry, on_change)

        self._watch_task = asyncio.create_task(follow())

    async def _open_watch(self) -> tuple[int, Any]:
        """The sequence the current entries end at (0: none), and a watcher of them all."""
        state = (await self._js.stream_info(f"KV_{self._bucket}")).state
        return (state.last_seq if state.messages else 0), await self._kv.watchall()

    async def close(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()


def _deliver(entry: Any, on_change: Callable[[str, bytes | None], None]) -> None:
    deleted = entry.operation in ("DEL", "PURGE")
    try:
        on_change(entry.key, None if deleted else entry.value)
    except Exception:
        log.exception("registry update for %s failed", entry.key)
