"""Pulling from a durable JetStream consumer, and a pulled message as a `Delivery`.

Pulling is done here rather than with nats-py's `PullSubscription.fetch`: after a
lingering pull delivers its first message, that `fetch` keeps waiting for the rest of the
batch until the request expires, which would add its whole timeout to a lightly loaded
worker's latency. `JetStreamPuller.fetch` instead long-polls for one message, then takes
whatever else is already waiting with a `no_wait` request, and never leaves a request open
on the server that could deliver messages nobody is waiting for. That second request is
made only where the last message says more were waiting (its `num_pending`): for a lone
request it would be a round trip to the server, ~0.7 ms of its first token's time on the
Xeon VM, that brings nothing (perf/results/README.md).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api

from ..source import Delivery

__all__ = ["JetStreamPuller", "NatsDelivery"]

_STATUS = api.Header.STATUS


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

    def __init__(self, nc: Client, stream: str, consumer: str) -> None:
        self._nc = nc
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._inbox = self._nc.new_inbox()
        self._arrived: asyncio.Queue[Msg] = asyncio.Queue()
        self._sub: Any = None
        self._more_waiting = False
        """Whether the consumer held more messages when the last one taken was delivered."""

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
        if got and len(got) < max_items and self._more_waiting:
            await self._request({"batch": max_items - len(got), "no_wait": True})
            await self._collect(got, max_items, 1.0)
        return got

    def _drain(self, got: list[Delivery], limit: int) -> None:
        while len(got) < limit and not self._arrived.empty():
            msg = self._arrived.get_nowait()
            if not (msg.headers and _STATUS in msg.headers):
                self._take(got, msg)

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
            self._take(got, msg)

    def _take(self, got: list[Delivery], msg: Msg) -> None:
        got.append(NatsDelivery(msg))
        self._more_waiting = bool(msg.metadata.num_pending)

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        # Whatever was delivered but never handed out goes back at once.
        while not self._arrived.empty():
            msg = self._arrived.get_nowait()
            if not (msg.headers and _STATUS in msg.headers):
                await msg.nak()
