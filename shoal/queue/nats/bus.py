"""One NATS connection: connecting (and waiting for a server still starting),
publishing, subscribing, provisioning streams, consumers and buckets, and reading what
JetStream holds (consumer states, stored messages)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api

from ...config import NatsSettings
from ...lifecycle import retry_until_ready
from ..errors import QueueFullError, QueueUnavailableError
from .connect import connect_options, servers
from .kv import NatsKeyValue
from .provisioning import provisioning
from .pull import JetStreamPuller

__all__ = ["Bus", "ConsumerState", "StoredMessage"]

log = logging.getLogger(__name__)

# JetStream API error codes for a stream at its `discard: new` bound.
_STREAM_FULL_CODES = {10077, 10078, 10047}  # max messages, max bytes, storage exhausted
_MSG_ID = api.Header.MSG_ID
_CLOSE_S = 2.0


class ConsumerState(msgspec.Struct, frozen=True):
    """What JetStream says of one consumer."""

    name: str
    filter_subject: str
    pending: int
    """Items not delivered yet."""
    ack_pending: int
    """Items delivered and not yet acked."""
    delivered: int
    """Deliveries so far (the consumer's sequence)."""


class StoredMessage(msgspec.Struct, frozen=True):
    """A message as a stream holds it."""

    seq: int
    subject: str
    data: bytes


class Bus:
    """One NATS connection and its JetStream context."""

    def __init__(self, nc: Client, settings: NatsSettings) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.jsm = nc.jsm()
        self._settings = settings
        self._ready_within = settings.ready_within

    @classmethod
    async def connect(
        cls,
        settings: NatsSettings,
        name: str,
        on_disconnect: Callable[[], Awaitable[None]] | None = None,
    ) -> Bus:
        """Connect (one attempt of at most twice `connect_timeout`), then reconnect in the
        background, forever, whenever the connection drops.

        Raises:
            QueueUnavailableError: the first connection failed.
            ValueError: the settings name TLS or credential files that do not load.
        """

        options = connect_options(settings)
        # What the server answered (a refused login) says more than the broken pipe
        # that follows it: the error message names it first.
        errors: dict[str, Exception] = {}

        async def _error(exc: Exception) -> None:
            errors["said" if isinstance(exc, nats.errors.Error) else "other"] = exc
            log.warning("nats: %s", exc)

        async def _disconnected() -> None:
            log.warning("nats: disconnected")
            if on_disconnect is not None:
                await on_disconnect()

        async def _reconnected() -> None:
            log.info("nats: reconnected")

        # nats-py's own first connect retries forever when reconnects are allowed (as
        # they must be once connected): bound one attempt here, and let `open` retry.
        try:
            nc = await asyncio.wait_for(
                nats.connect(
                    servers=servers(settings),
                    name=name,
                    connect_timeout=settings.connect_timeout,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    allow_reconnect=True,
                    error_cb=_error,
                    disconnected_cb=_disconnected,
                    reconnected_cb=_reconnected,
                    **options,
                ),
                2 * settings.connect_timeout,
            )
        except (OSError, nats.errors.Error, TimeoutError) as exc:
            # A refused password or certificate shows only in the error callback.
            seen = errors.get("said") or errors.get("other")
            cause = f"{exc!r}" + (f" (last: {seen!r})" if seen else "")
            raise QueueUnavailableError(
                f"cannot connect to NATS at {settings.display_url}: {cause}"
            ) from exc
        return cls(nc, settings)

    @classmethod
    async def open(
        cls,
        settings: NatsSettings,
        name: str,
        on_disconnect: Callable[[], Awaitable[None]] | None = None,
    ) -> Bus:
        """`connect`, retried while the server is not up yet (starting beside this
        process), for `settings.ready_within` seconds.

        Raises:
            QueueUnavailableError: no connection within that time.
        """
        return await retry_until_ready(
            lambda: cls.connect(settings, name, on_disconnect),
            what=f"NATS at {settings.display_url}",
            retry_on=(QueueUnavailableError,),
            within=settings.ready_within,
        )

    @property
    def is_connected(self) -> bool:
        return self.nc.is_connected

    @property
    def max_payload(self) -> int:
        """The largest message the server takes (its INFO says)."""
        return self.nc.max_payload

    async def close(self) -> None:
        """Drain (pending publishes and acks go out), for a few seconds at most: while
        the server is away a drain would wait for it."""
        if self.nc.is_closed:
            return
        try:
            await asyncio.wait_for(self.nc.drain(), _CLOSE_S)
        except (nats.errors.Error, TimeoutError):
            # Not connected now (the server went first): drop what is pending.
            with contextlib.suppress(nats.errors.Error, RuntimeError, OSError):
                await self.nc.close()

    # Publishing -------------------------------------------------------------------

    async def publish_work(
        self, items: list[tuple[str, bytes, str]], headers: Mapping[str, str] | None = None
    ) -> None:
        """Publish `(subject, payload, msg_id)` items to JetStream concurrently and wait
        for every PubAck; `headers` (trace context) go on each. (nats-py's `publish_async`
        never resolves its future when the server answers with an error, such as a full
        stream, so it is not used.)

        Raises:
            QueueFullError: the stream is at its bound.
            QueueUnavailableError: NATS or the stream is unreachable.
        """
        timeout = self._settings.connect_timeout
        extra = headers or {}
        results = await asyncio.gather(
            *(
                self.js.publish(
                    subject, payload, timeout=timeout, headers={**extra, _MSG_ID: msg_id}
                )
                for subject, payload, msg_id in items
            ),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, nats.js.errors.APIError):
                if result.err_code in _STREAM_FULL_CODES:
                    raise QueueFullError()
                raise QueueUnavailableError(f"publishing work failed: {result}")
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                raise QueueUnavailableError(f"publishing work failed: {result!r}")

    async def publish_once(self, subject: str, payload: bytes, msg_id: str) -> None:
        """JetStream publish, kept once per `msg_id` within the duplicate window.

        Raises:
            nats.errors.Error: not stored (the caller decides what that means).
        """
        timeout = self._settings.connect_timeout
        await self.js.publish(subject, payload, timeout=timeout, headers={_MSG_ID: msg_id})

    async def publish(self, subject: str, payload: bytes) -> None:
        """Core NATS publish (replies, heartbeats): at most once, no ack."""
        await self.nc.publish(subject, payload)

    async def subscribe(
        self,
        subject: str,
        handler: Callable[[bytes], Awaitable[None] | None],
        queue: str = "",
    ) -> Any:
        """Call `handler(payload)` (awaited if it is a coroutine) for each message on
        `subject`, in arrival order; with `queue`, each message reaches one subscriber of
        that queue group. Returns the subscription (`unsubscribe()` ends it)."""

        async def _cb(msg: Msg) -> None:
            result = handler(msg.data)
            if inspect.isawaitable(result):
                await result

        return await self.nc.subscribe(subject, queue=queue, cb=_cb, pending_msgs_limit=1_000_000)

    # Streams and consumers -------------------------------------------------------

    async def ensure_stream(self, config: dict[str, Any]) -> None:
        """Create the stream, or bring an existing one to `config` (what can change)."""
        await provisioning(
            f"stream {config['name']}", lambda: self._ensure_stream(config), self._ready_within
        )

    async def _ensure_stream(self, config: dict[str, Any]) -> None:
        jsm = self.jsm
        cfg = api.StreamConfig(**config)
        try:
            await jsm.stream_info(cfg.name)
        except nats.js.errors.NotFoundError:
            try:
                await jsm.add_stream(cfg)
                return
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != 10058:  # created meanwhile by another process
                    raise
        try:
            await jsm.update_stream(cfg)
        except nats.js.errors.BadRequestError as exc:
            log.warning("stream %s kept its config: %s", cfg.name, exc.description)

    async def ensure_consumer(self, stream: str, config: dict[str, Any]) -> None:
        """Create the durable consumer or update it to `config`."""
        cfg = api.ConsumerConfig(**config)

        async def ensure() -> None:
            try:
                await self.jsm.add_consumer(stream, cfg)
            except nats.js.errors.BadRequestError as exc:
                log.warning("consumer %s kept its config: %s", cfg.durable_name, exc.description)

        await provisioning(f"consumer {cfg.durable_name}", ensure, self._ready_within)

    async def stream_state(self, stream: str) -> dict[str, int]:
        """Messages and bytes held, and the first and last sequence.

        Raises:
            QueueUnavailableError: no such stream, or NATS did not answer.
        """
        try:
            state = (await self.jsm.stream_info(stream)).state
        except (nats.errors.Error, TimeoutError) as exc:
            raise QueueUnavailableError(f"stream {stream}: {exc!r}") from exc
        return {
            "messages": state.messages,
            "bytes": state.bytes,
            "first_seq": state.first_seq,
            "last_seq": state.last_seq,
        }

    async def consumer_states(self, stream: str, consumer: str = "") -> list[ConsumerState]:
        """The state of `consumer` (or of every consumer of `stream`).

        Raises:
            QueueUnavailableError: no such consumer yet, or NATS did not answer.
        """
        try:
            if consumer:
                infos = [await self.jsm.consumer_info(stream, consumer)]
            else:
                infos = await self.jsm.consumers_info(stream)
        except (nats.errors.Error, TimeoutError) as exc:
            raise QueueUnavailableError(f"consumers of {stream}: {exc!r}") from exc
        return [
            ConsumerState(
                name=info.name,
                filter_subject=info.config.filter_subject or "",
                pending=info.num_pending or 0,
                ack_pending=info.num_ack_pending or 0,
                delivered=(info.delivered.consumer_seq or 0) if info.delivered else 0,
            )
            for info in infos
        ]

    async def stored(self, stream: str, seq: int) -> StoredMessage | None:
        """The message at `seq` in `stream`; None when there is none (deleted, aged out).

        Raises:
            QueueUnavailableError: NATS did not answer.
        """
        try:
            raw = await self.jsm.get_msg(stream, seq)
        except nats.js.errors.NotFoundError:
            return None
        except (nats.errors.Error, TimeoutError) as exc:
            raise QueueUnavailableError(f"{stream} #{seq}: {exc!r}") from exc
        return StoredMessage(seq=raw.seq or seq, subject=raw.subject or "", data=raw.data or b"")

    async def delete_stored(self, stream: str, seq: int) -> None:
        """Delete the message at `seq` (none there: nothing to do)."""
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await self.jsm.delete_msg(stream, seq)

    async def key_value(self, bucket: str) -> NatsKeyValue:
        """The bucket, created (file storage, replicas as the work stream) if missing."""
        kv = await provisioning(
            f"bucket {bucket}", lambda: self._key_value(bucket), self._ready_within
        )
        return NatsKeyValue(kv, self.js, bucket, self._ready_within)

    async def _key_value(self, bucket: str) -> Any:
        try:
            return await self.js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            try:
                return await self.js.create_key_value(
                    bucket=bucket,
                    history=1,
                    storage="file",
                    replicas=self._settings.replicas,
                )
            except nats.js.errors.BadRequestError:
                return await self.js.key_value(bucket)  # created meanwhile elsewhere

    async def puller(self, stream: str, consumer: str) -> JetStreamPuller:
        puller = JetStreamPuller(self.nc, stream, consumer)
        await puller.start()
        return puller
