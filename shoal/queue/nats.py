"""The only module that imports nats-py: connections, publishing, pulling, streams.

Pulling is done here rather than with nats-py's `PullSubscription.fetch`: after a
lingering pull delivers its first message, that `fetch` keeps waiting for the rest of the
batch until the request expires, which would add its whole timeout to a lightly loaded
worker's latency. `JetStreamPuller.fetch` instead long-polls for one message, then takes
whatever else is already waiting with a `no_wait` request, and never leaves a request open
on the server that could deliver messages nobody is waiting for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api

from ..config import NatsSettings
from ..lifecycle import retry_until_ready
from .errors import KeyConflictError, QueueFullError, QueueUnavailableError
from .source import Delivery

__all__ = [
    "Bus",
    "JetStreamPuller",
    "NatsDelivery",
    "NatsKeyValue",
    "wait_jetstream",
]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# JetStream API error codes for a stream at its `discard: new` bound.
_STREAM_FULL_CODES = {10077, 10078, 10047}  # max messages, max bytes, storage exhausted
_STATUS = api.Header.STATUS
_MSG_ID = api.Header.MSG_ID


class NatsDelivery:
    """A JetStream message as a `Delivery`."""

    __slots__ = ("_msg",)

    def __init__(self, msg: Msg) -> None:
        self._msg = msg

    @property
    def data(self) -> bytes:
        return self._msg.data

    @property
    def num_delivered(self) -> int:
        return self._msg.metadata.num_delivered or 1

    @property
    def published_at(self) -> float:
        """Unix time the item entered the stream."""
        return self._msg.metadata.timestamp.timestamp()

    @property
    def subject(self) -> str:
        return self._msg.subject

    @property
    def headers(self) -> dict[str, str] | None:
        return self._msg.headers

    @property
    def stream_seq(self) -> int:
        return self._msg.metadata.sequence.stream

    async def ack(self) -> None:
        await self._msg.ack()

    async def nak(self, delay: float = 0.0) -> None:
        await self._msg.nak(delay=delay or None)

    async def term(self) -> None:
        await self._msg.term()

    async def in_progress(self) -> None:
        await self._msg.in_progress()


class JetStreamPuller:
    """A durable pull consumer, pulled without leaving requests open (see module doc)."""

    def __init__(self, bus: Bus, stream: str, consumer: str) -> None:
        self._nc = bus.nc
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._inbox = self._nc.new_inbox()
        self._arrived: asyncio.Queue[Msg] = asyncio.Queue()
        self._sub: Any = None

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(self._inbox, cb=self._on_msg)

    async def _on_msg(self, msg: Msg) -> None:
        self._arrived.put_nowait(msg)

    async def fetch(self, max_items: int, max_wait: float) -> list[Delivery]:
        got: list[Delivery] = []
        self._drain(got, max_items)
        if not got:
            await self._request({"batch": 1, "expires": int(max_wait * 1e9)})
            await self._collect(got, 1, max_wait + 1.0)
        if got and len(got) < max_items:
            await self._request({"batch": max_items - len(got), "no_wait": True})
            await self._collect(got, max_items, 1.0)
        return got

    def _drain(self, got: list[Delivery], limit: int) -> None:
        while len(got) < limit and not self._arrived.empty():
            msg = self._arrived.get_nowait()
            if not (msg.headers and _STATUS in msg.headers):
                got.append(NatsDelivery(msg))

    async def _request(self, body: dict[str, Any]) -> None:
        await self._nc.publish(self._next_subject, json.dumps(body).encode(), reply=self._inbox)

    async def _collect(self, got: list[Delivery], limit: int, wait: float) -> None:
        """Take arrivals until `limit`, a status message (the request ended) or timeout."""
        loop = asyncio.get_running_loop()
        until = loop.time() + wait
        while len(got) < limit:
            try:
                msg = await asyncio.wait_for(self._arrived.get(), until - loop.time())
            except TimeoutError:
                return
            if msg.headers and _STATUS in msg.headers:
                if msg.headers[_STATUS] == "100":  # idle heartbeat: the request is alive
                    continue
                return
            got.append(NatsDelivery(msg))

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        # Whatever was delivered but never handed out goes back at once.
        while not self._arrived.empty():
            msg = self._arrived.get_nowait()
            if not (msg.headers and _STATUS in msg.headers):
                await msg.nak()


async def wait_jetstream(url: str, within: float = 30.0) -> None:
    """Until JetStream at `url` (comma-separated servers) answers API requests: a new
    cluster answers only once its nodes have elected a meta leader.

    Raises:
        TimeoutError: not within `within` seconds.
    """

    async def answers() -> None:
        nc = await nats.connect(url.split(","), connect_timeout=2, allow_reconnect=False)
        try:
            await nc.jsm().account_info()
        finally:
            await nc.close()

    try:
        await retry_until_ready(
            answers,
            what=f"JetStream at {url}",
            retry_on=(OSError, nats.errors.Error, TimeoutError),
            within=within,
        )
    except (OSError, nats.errors.Error, TimeoutError) as exc:
        raise TimeoutError(f"JetStream at {url} not ready in {within}s: {exc!r}") from exc


async def _provisioning(what: str, call: Callable[[], Awaitable[_T]], within: float) -> _T:
    """`call()`, retried while JetStream is not answering in time.

    A cluster that is still electing leaders, or that several processes ask at once to
    create replicated streams (`shoal serve --nats-nodes 3` on two cores), can time out
    an admin request it then completes. Every call here is idempotent, so retry it.
    """
    return await retry_until_ready(
        call,
        what=what,
        retry_on=(nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError),
        within=within,
        first_delay=0.5,
    )


_CLOSE_S = 2.0
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

    def __init__(self, kv: Any, js: Any, bucket: str) -> None:
        self._kv = kv
        self._js = js
        self._bucket = bucket
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
        prefix, stream = f"$KV.{self._bucket}.", f"KV_{self._bucket}"
        sub = await self._js.pull_subscribe(
            f"{prefix}>",
            stream=stream,
            config=api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
                ack_policy=api.AckPolicy.NONE,
                headers_only=True,
                mem_storage=True,
                inactive_threshold=_KEYS_CONSUMER_IDLE_S,
            ),
        )
        keys: list[str] = []
        consumer = ""
        try:
            info = await sub.consumer_info()
            consumer, pending = info.name, info.num_pending
            while pending:
                for msg in await sub.fetch(min(pending, _KEYS_FETCH), timeout=_KEYS_FETCH_S):
                    pending = msg.metadata.num_pending
                    if _holds_value(msg):
                        keys.append(msg.subject[len(prefix) :])
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
        return keys

    async def delete(self, key: str) -> None:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await self._kv.delete(key)

    async def watch(self, on_change: Callable[[str, bytes | None], None]) -> None:
        """Call `on_change(key, value)` for every current entry, return, then keep calling
        it for every change (`None` for a deletion) until `close()`."""
        # The current entries end at the stream's last message (the last of its key, so
        # it is delivered). nats-py's own end-of-current-entries marker can come before
        # entries already in flight, as in `keys()`: it is not waited for.
        state = (await self._js.stream_info(f"KV_{self._bucket}")).state
        last = state.last_seq if state.messages else 0
        watcher = await self._kv.watchall()
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

    async def close(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()


def _deliver(entry: Any, on_change: Callable[[str, bytes | None], None]) -> None:
    deleted = entry.operation in ("DEL", "PURGE")
    try:
        on_change(entry.key, None if deleted else entry.value)
    except Exception:
        log.exception("registry update for %s failed", entry.key)


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
        """

        async def _error(exc: Exception) -> None:
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
                    servers=[s.strip() for s in settings.url.split(",")],
                    name=name,
                    connect_timeout=settings.connect_timeout,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    allow_reconnect=True,
                    error_cb=_error,
                    disconnected_cb=_disconnected,
                    reconnected_cb=_reconnected,
                ),
                2 * settings.connect_timeout,
            )
        except (OSError, nats.errors.Error, TimeoutError) as exc:
            raise QueueUnavailableError(f"cannot connect to NATS at {settings.url}: {exc}") from exc
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
            what=f"NATS at {settings.url}",
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

    async def subscribe(self, subject: str, handler: Callable[[bytes], None]) -> Any:
        """Call `handler(payload)` for each message on `subject`, in arrival order."""

        async def _cb(msg: Msg) -> None:
            handler(msg.data)

        return await self.nc.subscribe(subject, cb=_cb, pending_msgs_limit=1_000_000)

    # Streams and consumers -------------------------------------------------------

    async def ensure_stream(self, config: dict[str, Any]) -> None:
        """Create the stream, or bring an existing one to `config` (what can change)."""
        await _provisioning(
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

        await _provisioning(f"consumer {cfg.durable_name}", ensure, self._ready_within)

    async def stream_state(self, stream: str) -> dict[str, int]:
        info = await self.jsm.stream_info(stream)
        return {"messages": info.state.messages, "bytes": info.state.bytes}

    async def key_value(self, bucket: str) -> NatsKeyValue:
        """The bucket, created (file storage, replicas as the work stream) if missing."""
        kv = await _provisioning(
            f"bucket {bucket}", lambda: self._key_value(bucket), self._ready_within
        )
        return NatsKeyValue(kv, self.js, bucket)

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
        puller = JetStreamPuller(self, stream, consumer)
        await puller.start()
        return puller
