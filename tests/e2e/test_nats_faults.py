"""NATS and gateway faults under load, with real nats-servers and real Shoal processes.

Each test paces a bounded embeddings load (open-loop arrivals, bounded concurrency, a
client timeout on every call), breaks something mid-load, and accounts for every request:
answered with the right vectors, refused with a retryable OpenAI-shaped error, or lost
(a hang, a wrong vector, any other status). Lost must be zero.

1. nats-server (file storage) killed with SIGKILL and restarted on the same port and
   store dir: the gateway and the worker reconnect on their own.
2. A 3-node cluster with the work stream and the KV buckets at R3: the stream leader is
   killed; with retries on 429/503/504 every request ends in 200.
3. The gateway killed with SIGKILL and restarted on the same port while the worker keeps
   serving: the work stream drains to empty.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest

from shoal.queue.embedded import EmbeddedNats, free_port
from tests.helpers import (
    ShoalProcess,
    shoal_env,
    start_gateway,
    start_worker,
    wait_ready,
    wait_until,
)
from tests.nats_cluster import NatsCluster, stream_view, wait_jetstream
from tests.openai_schema import validate

pytestmark = pytest.mark.slow

STREAM = "SHOAL_WORK"
RETRYABLE = (429, 503, 504)
CLIENT_TIMEOUT = 45.0
"""Per HTTP call: longer than any gateway deadline below, so a timeout means a hang."""


@dataclass
class Tally:
    """What happened to every request of a load (outcome) and to every call (events)."""

    outcome: dict[int, str] = field(default_factory=dict)
    """Per request, its last call: `ok`, `retryable:<status>`, `transport`, `hung`,
    `wrong` or `other:<status>`."""
    events: Counter[str] = field(default_factory=Counter)
    """Per call that was not a 200: its kind, as in `outcome`."""
    codes: Counter[str] = field(default_factory=Counter)
    """Per retryable error: `<status>:<OpenAI error code>`."""
    retries: int = 0
    ok_started_after: int = 0
    """Requests answered 200 whose last call started after the fault ended."""
    fault_done_at: float = math.inf
    details: list[str] = field(default_factory=list)

    def counts(self) -> Counter[str]:
        return Counter(self.outcome.values())

    def ok(self) -> int:
        return sum(1 for v in self.outcome.values() if v == "ok")

    def summary(self, name: str, sent: int) -> str:
        return (
            f"[{name}] sent={sent} outcomes={dict(self.counts())} "
            f"retries={self.retries} non-200 calls={dict(self.events)} codes={dict(self.codes)} "
            f"ok after fault={self.ok_started_after}"
        )


def make_texts(tag: str, n: int) -> list[list[str]]:
    return [
        [f"{tag} request {i} first", f"{tag} {i} second " + "pad " * (i % 13)] for i in range(n)
    ]


def reference(st_model, texts: list[list[str]]) -> np.ndarray:
    flat = [t for group in texts for t in group]
    return st_model.encode(flat, batch_size=64).reshape(len(texts), len(texts[0]), -1)


def check_retryable(response: httpx.Response) -> float:
    """An OpenAI-shaped error; 429 and 503 carry Retry-After. Returns the seconds to wait."""
    body = response.json()
    validate(body, "ErrorResponse")
    assert body["error"]["message"], body
    if response.status_code in (429, 503):
        assert "retry-after" in response.headers, (response.status_code, response.text)
        return float(response.headers["retry-after"])
    return 0.5


async def drive(
    base: str,
    model: str,
    texts: list[list[str]],
    expected: np.ndarray,
    *,
    attempts: int,
    rate: float = 30.0,
    concurrency: int = 16,
    fault: Callable[[], Awaitable[None]] | None = None,
    fault_after: int = 0,
    bound: float = 150.0,
) -> Tally:
    """Send `len(texts)` requests, request i no earlier than i/rate seconds in and at most
    `concurrency` at once; each makes up to `attempts` calls, retrying retryable statuses
    and transport errors. Runs `fault()` once `fault_after` requests have succeeded."""
    tally = Tally()
    gate = asyncio.Semaphore(concurrency)
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def one(client: httpx.AsyncClient, i: int) -> None:
        await asyncio.sleep(max(0.0, t0 + i / rate - loop.time()))
        async with gate:
            for attempt in range(attempts):
                started = time.monotonic()
                kind, wait = await call(client, i)
                tally.outcome[i] = kind
                if kind == "ok":
                    tally.ok_started_after += started > tally.fault_done_at
                    return
                tally.events[kind] += 1
                retryable = kind.startswith("retryable") or kind == "transport"
                if not retryable or attempt == attempts - 1:
                    return
                tally.retries += 1
                await asyncio.sleep(min(wait, 2.0))

    async def call(client: httpx.AsyncClient, i: int) -> tuple[str, float]:
        body = {"model": model, "input": texts[i], "encoding_format": "float"}
        try:
            r = await client.post("/v1/embeddings", json=body)
        except httpx.TimeoutException:
            return "hung", 0.0
        except httpx.TransportError as exc:  # the gateway is down or went down mid-call
            tally.details.append(f"{i}: {exc!r}")
            return "transport", 0.5
        if r.status_code in RETRYABLE:
            tally.codes[f"{r.status_code}:{r.json()['error'].get('code')}"] += 1
            return f"retryable:{r.status_code}", check_retryable(r)
        if r.status_code != 200:
            tally.details.append(f"{i}: {r.status_code} {r.text[:300]}")
            return f"other:{r.status_code}", 0.0
        got = np.array([d["embedding"] for d in sorted(r.json()["data"], key=lambda d: d["index"])])
        if got.shape != expected[i].shape or (got * expected[i]).sum(1).min() < 0.9999:
            tally.details.append(f"{i}: wrong vectors")
            return "wrong", 0.0
        return "ok", 0.0

    async with httpx.AsyncClient(base_url=base, timeout=CLIENT_TIMEOUT) as client:
        tasks = [asyncio.create_task(one(client, i)) for i in range(len(texts))]
        try:
            if fault is not None:
                deadline = loop.time() + 60
                while tally.ok() < fault_after:
                    assert loop.time() < deadline, "the load never got going"
                    assert not all(t.done() for t in tasks), "the load ended before the fault"
                    await asyncio.sleep(0.02)
                assert tally.ok() < len(texts), "the load finished before the fault"
                await fault()
                tally.fault_done_at = time.monotonic()
            await asyncio.wait_for(asyncio.gather(*tasks), bound)
        finally:
            for task in tasks:
                task.cancel()
    return tally


def assert_nothing_lost(tally: Tally, sent: int, allowed: tuple[str, ...]) -> None:
    counts = tally.counts()
    assert sum(counts.values()) == sent
    lost = {k: v for k, v in counts.items() if k != "ok" and k not in allowed}
    assert not lost, (lost, tally.details[:20])


async def final_batch(base: str, model: str, st_model, tag: str, n: int = 20) -> None:
    texts = make_texts(tag, n)
    tally = await drive(base, model, texts, reference(st_model, texts), attempts=1, rate=100)
    assert tally.counts() == {"ok": n}, (tally.counts(), tally.details[:10])


async def until_empty(url: str, timeout: float = 60.0) -> None:
    """Until the work stream holds nothing and no consumer has anything pending."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        view = await stream_view(url, STREAM)
        busy = {k: v for k, v in view.consumers.items() if v != (0, 0)}
        if view.messages == 0 and not busy:
            return
        assert loop.time() < deadline, f"work stuck in {STREAM}: {view}"
        await asyncio.sleep(0.5)


# 1. nats-server restart ------------------------------------------------------------------


async def test_nats_server_killed_and_restarted_mid_load(tmp_path: Path, st_model, model_name):
    server = EmbeddedNats(tmp_path / "nats", port=free_port())
    nats_log = tmp_path / "nats-server.log"
    server.start(log_file=nats_log)
    env = {"SHOAL_GATEWAY__REQUEST_TIMEOUT": "15", "SHOAL_NATS__ACK_WAIT": "5"}
    worker = start_worker(server.url, tmp_path, extra=env)
    gateway, base = start_gateway(server.url, tmp_path, env)
    try:
        wait_ready(base, worker)
        n = 200
        texts = make_texts("restart", n)
        expected = reference(st_model, texts)

        async def restart_nats() -> None:
            server.kill()
            await asyncio.sleep(1.5)
            await asyncio.to_thread(server.start, 15.0, nats_log)

        tally = await drive(
            base, model_name, texts, expected, attempts=1, fault=restart_nats, fault_after=50
        )
        print(tally.summary("nats restart", n))
        assert_nothing_lost(tally, n, ("retryable:429", "retryable:503", "retryable:504"))
        assert tally.ok_started_after > 0, "nothing succeeded after the restart"
        assert gateway.alive(), gateway.log()
        assert worker.alive(), worker.log()
        await asyncio.to_thread(wait_ready, base, worker, 60.0)
        await final_batch(base, model_name, st_model, "after restart")
        await until_empty(server.url)
    finally:
        gateway.stop()
        worker.stop()
        server.stop()


# 2. R3 cluster, stream leader killed -------------------------------------------------------


async def test_r3_cluster_loses_nothing_when_the_stream_leader_dies(
    tmp_path: Path, st_model, model_name
):
    cluster = NatsCluster(tmp_path / "cluster").start()
    worker = gateway = None
    try:
        await wait_jetstream(cluster.url)
        env = {
            "SHOAL_NATS__REPLICAS": "3",
            "SHOAL_NATS__ACK_WAIT": "3",
            "SHOAL_GATEWAY__REQUEST_TIMEOUT": "20",
        }
        worker = start_worker(cluster.url, tmp_path, extra=env)
        gateway, base = start_gateway(cluster.url, tmp_path, env)
        wait_ready(base, worker)
        view = await stream_view(cluster.url, STREAM)
        assert view.replicas == 3, view
        assert (await stream_view(cluster.url, "KV_SHOAL_REGISTRY")).replicas == 3
        leader = view.leader
        assert leader in cluster.nodes, view

        n = 200
        texts = make_texts("cluster", n)
        expected = reference(st_model, texts)

        async def kill_leader() -> None:
            cluster.nodes[leader].kill()

        tally = await drive(
            base, model_name, texts, expected, attempts=10, fault=kill_leader, fault_after=50
        )
        print(tally.summary(f"R3, leader {leader} killed", n))
        assert_nothing_lost(tally, n, ())
        assert gateway.alive(), gateway.log()
        assert worker.alive(), worker.log()
        after = await stream_view(cluster.url, STREAM)
        assert after.leader not in (None, leader), after
        await final_batch(base, model_name, st_model, "after leader loss")
        await until_empty(cluster.url)
    finally:
        if gateway is not None:
            gateway.stop()
        if worker is not None:
            worker.stop()
        cluster.stop()


# 3. Gateway restart ----------------------------------------------------------------------


def gateway_on(port: int, nats_url: str, data_dir: Path, extra: dict[str, str]) -> ShoalProcess:
    """A gateway on a given port (start_gateway picks a free one); returns once /health
    answers."""
    env = shoal_env(nats_url, data_dir, extra)
    proc = ShoalProcess(["gateway", "--port", str(port)], env, data_dir / f"gateway-{port}.log")
    url = f"http://127.0.0.1:{port}/health"
    wait_until(lambda: _healthy(url), 60, proc, "gateway /health")
    return proc


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


async def test_gateway_killed_and_restarted_while_the_worker_keeps_serving(
    nats_server: EmbeddedNats, tmp_path: Path, st_model, model_name
):
    env = {"SHOAL_GATEWAY__REQUEST_TIMEOUT": "15", "SHOAL_NATS__ACK_WAIT": "5"}
    worker = start_worker(nats_server.url, tmp_path, extra=env)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    gateways = [gateway_on(port, nats_server.url, tmp_path, env)]
    try:
        wait_ready(base, worker)
        worker_pid = worker.pid
        n = 200
        texts = make_texts("gateway", n)
        expected = reference(st_model, texts)

        async def restart_gateway() -> None:
            gateways[0].kill()
            gateways.append(
                await asyncio.to_thread(gateway_on, port, nats_server.url, tmp_path, env)
            )

        tally = await drive(
            base, model_name, texts, expected, attempts=30, fault=restart_gateway, fault_after=50
        )
        print(tally.summary("gateway restart", n))
        assert_nothing_lost(tally, n, ())
        assert tally.ok_started_after > 0
        assert worker.alive() and worker.pid == worker_pid, worker.log()
        await asyncio.to_thread(wait_ready, base, worker, 30.0)
        await final_batch(base, model_name, st_model, "after gateway restart")
        await until_empty(nats_server.url)
    finally:
        for gateway in gateways:
            gateway.stop()
        worker.stop()
