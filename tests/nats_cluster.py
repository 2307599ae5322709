"""Real nats-servers for fault tests: a 3-node JetStream cluster on loopback, and
JetStream queries (stream leader, message counts) made from the test process."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import nats.js.errors

from shoal.config import NatsSettings
from shoal.queue import nats as shoal_nats
from shoal.queue.embedded import EmbeddedNatsCluster

__all__ = ["NatsCluster", "StreamView", "stream_view", "wait_jetstream"]


async def wait_jetstream(url: str, within: float = 30.0) -> None:
    """Until JetStream at `url` (an open test cluster) answers."""
    await shoal_nats.wait_jetstream(NatsSettings(url=url), within)


class NatsCluster(EmbeddedNatsCluster):
    """The cluster for fault tests: logs in its root, readable by node name."""

    def __init__(self, root: Path, size: int = 3, name: str = "shoal-faults") -> None:
        super().__init__(root, size, name)

    def start(self) -> NatsCluster:
        super().start(log_dir=self.root)
        return self

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")[-4000:]


@dataclass(frozen=True)
class StreamView:
    messages: int
    leader: str | None
    replicas: int
    consumers: dict[str, tuple[int, int]]
    """Per consumer: (pending, ack pending)."""


async def stream_view(
    url: str, stream: str, timeout: float = 15.0, **credentials: str
) -> StreamView:
    """The stream's message count, leader and consumers' backlogs, retrying for
    `timeout` seconds while a leader is being elected. `credentials`: nats-py's `user`
    and `password` (or `token`) for a server that asks for them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    nc = await nats.connect(
        url.split(","), connect_timeout=2, max_reconnect_attempts=3, **credentials
    )
    try:
        jsm = nc.jsm()
        while True:
            try:
                info = await jsm.stream_info(stream)
                consumers = {
                    c.name: (c.num_pending or 0, c.num_ack_pending or 0)
                    for c in await jsm.consumers_info(stream)
                }
                leader = info.cluster.leader if info.cluster is not None else None
                replicas = info.config.num_replicas or 1
                return StreamView(info.state.messages, leader, replicas, consumers)
            except (nats.errors.Error, TimeoutError):
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.3)
    finally:
        await nc.close()
