"""Real nats-servers for fault tests: a 3-node JetStream cluster on loopback, and
JetStream queries (stream leader, message counts) made from the test process."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import nats.js.errors

from shoal.queue.embedded import EmbeddedNats, free_port

__all__ = ["NatsCluster", "StreamView", "stream_view", "wait_jetstream"]


class NatsCluster:
    """`size` nats-servers routed to each other, each with JetStream, its own store dir
    and `server_name` `n0`, `n1`, ...; all on 127.0.0.1."""

    def __init__(self, root: Path, size: int = 3, name: str = "shoal-faults") -> None:
        self.root = root
        cluster_ports = [free_port() for _ in range(size)]
        self.nodes: dict[str, EmbeddedNats] = {}
        for i, cluster_port in enumerate(cluster_ports):
            routes = ",".join(
                f"nats://127.0.0.1:{p}" for j, p in enumerate(cluster_ports) if j != i
            )
            self.nodes[f"n{i}"] = EmbeddedNats(
                root / f"n{i}",
                extra_args=[
                    "--server_name", f"n{i}",
                    "--cluster_name", name,
                    "--cluster", f"nats://127.0.0.1:{cluster_port}",
                    "--routes", routes,
                ],
            )  # fmt: skip

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated (as `SHOAL_NATS__URL` takes them)."""
        return ",".join(node.url for node in self.nodes.values())

    def start(self) -> NatsCluster:
        for name, node in self.nodes.items():
            node.start(log_file=self.root / f"{name}.log")
        return self

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")[-4000:]


@dataclass(frozen=True)
class StreamView:
    messages: int
    leader: str | None
    replicas: int
    consumers: dict[str, tuple[int, int]]
    """Per consumer: (pending, ack pending)."""


async def wait_jetstream(url: str, timeout: float = 30.0) -> None:
    """Until JetStream answers API requests (a cluster has elected its meta leader)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Exception | None = None
    while loop.time() < deadline:
        try:
            nc = await nats.connect(url.split(","), connect_timeout=2, allow_reconnect=False)
        except (OSError, nats.errors.Error) as exc:
            last = exc
            await asyncio.sleep(0.2)
            continue
        try:
            await nc.jsm().account_info()
            return
        except (nats.errors.Error, TimeoutError) as exc:
            last = exc
            await asyncio.sleep(0.2)
        finally:
            await nc.close()
    raise TimeoutError(f"JetStream at {url} not ready in {timeout}s: {last!r}")


async def stream_view(url: str, stream: str, timeout: float = 15.0) -> StreamView:
    """The stream's message count, leader and consumers' backlogs, retrying for
    `timeout` seconds while a leader is being elected."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    nc = await nats.connect(url.split(","), connect_timeout=2, max_reconnect_attempts=3)
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
