"""Overload: the gateway under 10x the load its worker can serve, with and without its
admission bound, in one run on one machine.

    .venv/bin/python perf/overload.py [--seconds 30] [--factor 10]

1. Capacity: a closed loop of 8 in flight for `--probe` seconds gives the requests/s
   (64 short texts each) one worker answers through the gateway.
2. For each gateway setting (`max_in_flight` 256, then 100000, i.e. no bound, as a
   server that queues everything it is given), an open loop offers `--factor` x that
   rate for `--seconds` seconds (arrivals on a fixed schedule, not waiting for answers;
   at most `--clients` connections), each call with a 30 s client timeout. Recorded: the
   status of every request, p50/p99 latency of the answered ones, and the gateway's
   peak anonymous memory (sampled from /proc every 0.1 s) over its idle baseline.

Results go to perf/results/overload-<time>.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from perf.embed_throughput import machine, short_texts  # noqa: E402
from shoal.queue.embedded import EmbeddedNats, free_port  # noqa: E402
from tests.helpers import MODEL, start_gateway, start_worker, wait_ready  # noqa: E402

BATCH = 64


def rss_anon_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return 0.0


class PeakMemory:
    """Peak RssAnon of a process, sampled on a thread while the block runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_anon_mib(self.pid))
            except OSError:
                return
            time.sleep(0.1)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def body(texts: list[str], i: int) -> dict:
    start = (i * BATCH) % (len(texts) - BATCH)
    return {"model": MODEL, "input": texts[start : start + BATCH], "encoding_format": "base64"}


async def capacity(base: str, texts: list[str], seconds: float) -> float:
    """Requests/s answered with 8 in flight (closed loop)."""
    done = 0
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:

        async def loop(k: int) -> None:
            nonlocal done
            i = k
            while time.monotonic() < deadline:
                r = await client.post("/v1/embeddings", json=body(texts, i))
                if r.status_code != 200:
                    raise RuntimeError(f"{r.status_code}: {r.text}")
                done += 1
                i += 8

        started = time.monotonic()
        await asyncio.gather(*(loop(k) for k in range(8)))
    return done / (time.monotonic() - started)


async def offer(base: str, texts: list[str], rate: float, seconds: float, clients: int) -> dict:
    """Open loop: request i is sent at i/rate s (later only if all `clients` connections
    are busy); returns statuses and latencies."""
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    n = int(rate * seconds)
    gate = asyncio.Semaphore(clients)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        t0 = time.monotonic()

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            async with gate:
                started = time.monotonic()
                try:
                    r = await client.post("/v1/embeddings", json=body(texts, i))
                except httpx.TimeoutException:
                    statuses["client timeout"] += 1
                    return
                except httpx.TransportError as exc:
                    statuses[type(exc).__name__] += 1
                    return
                code = r.json().get("error", {}).get("code") if r.status_code != 200 else ""
                statuses[f"{r.status_code} {code}".strip()] += 1
                if r.status_code == 200:
                    latencies.append(time.monotonic() - started)

        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.monotonic() - t0
    lat = np.array(latencies) if latencies else np.array([np.nan])
    return {
        "offered": n,
        "offered_per_s": round(rate, 1),
        "wall_s": round(wall, 1),
        "statuses": dict(statuses),
        "answered_per_s": round(len(latencies) / wall, 1),
        "p50_s": round(float(np.percentile(lat, 50)), 3),
        "p99_s": round(float(np.percentile(lat, 99)), 3),
    }


async def until_drained(url: str, bound: float = 120.0) -> None:
    """Until the work stream is empty: the previous setting's leftovers (requests that
    timed out are dropped by the worker at their deadline) must not load the next one."""
    import nats

    nc = await nats.connect(url)
    try:
        deadline = time.monotonic() + bound
        while (await nc.jsm().stream_info("SHOAL_WORK")).state.messages:
            if time.monotonic() > deadline:
                raise TimeoutError("the work stream did not drain")
            await asyncio.sleep(0.5)
    finally:
        await nc.close()


def run_setting(
    server: EmbeddedNats, data: Path, texts: list[str], in_flight: int, rate: float, args
) -> dict:
    asyncio.run(until_drained(server.url))
    env = {"SHOAL_GATEWAY__MAX_IN_FLIGHT": str(in_flight), "SHOAL_GATEWAY__REQUEST_TIMEOUT": "15"}
    gateway, base = start_gateway(server.url, data, env)
    try:
        wait_ready(base)
        asyncio.run(capacity(base, texts, 2.0))  # warm the connection path
        baseline = rss_anon_mib(gateway.pid)
        with PeakMemory(gateway.pid) as memory:
            result = asyncio.run(offer(base, texts, rate, args.seconds, args.clients))
        alive = gateway.alive()
        after = httpx.post(f"{base}/v1/embeddings", json=body(texts, 0), timeout=60).status_code
    finally:
        gateway.stop()
    return {
        "max_in_flight": in_flight,
        **result,
        "gateway_rss_anon_idle_mib": round(baseline, 1),
        "gateway_rss_anon_peak_mib": round(memory.peak, 1),
        "gateway_growth_mib": round(memory.peak - baseline, 1),
        "gateway_alive_after": alive,
        "status_after": after,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--factor", type=float, default=10.0)
    parser.add_argument("--probe", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=1024)
    args = parser.parse_args()
    texts = short_texts(8192)
    work = Path(f"/tmp/shoal-overload-{time.time_ns()}")
    work.mkdir()
    server = EmbeddedNats(work / "nats", port=free_port()).start(log_file=work / "nats.log")
    worker = start_worker(server.url, work, extra={"SHOAL_GATEWAY__REQUEST_TIMEOUT": "15"})
    try:
        gateway, base = start_gateway(server.url, work)
        try:
            wait_ready(base, worker)
            asyncio.run(capacity(base, texts, 2.0))  # warm-up
            per_s = asyncio.run(capacity(base, texts, args.probe))
        finally:
            gateway.stop()
        rate = per_s * args.factor
        print(f"capacity {per_s:.1f} req/s of {BATCH} texts; offering {rate:.1f} req/s")
        settings = [run_setting(server, work, texts, bound, rate, args) for bound in (256, 100_000)]
    finally:
        worker.stop()
        server.stop()
    report = {
        "machine": machine(),
        "command": " ".join(["perf/overload.py", *sys.argv[1:]]),
        "texts_per_request": BATCH,
        "capacity_per_s": round(per_s, 2),
        "factor": args.factor,
        "settings": settings,
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = ROOT / "perf" / "results" / f"overload-{stamp}"
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    rows = [
        "| max_in_flight | offered (req/s) | answered (req/s) | statuses | p50 / p99 of 200s (s) "
        "| gateway RssAnon idle → peak (MiB) | alive, next request |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in settings:
        rows.append(
            f"| {s['max_in_flight']} | {s['offered_per_s']} | {s['answered_per_s']} | "
            f"{s['statuses']} | {s['p50_s']} / {s['p99_s']} | "
            f"{s['gateway_rss_anon_idle_mib']} → {s['gateway_rss_anon_peak_mib']} | "
            f"{s['gateway_alive_after']}, {s['status_after']} |"
        )
    text = (
        f"# Overload: {args.factor:g}x capacity for {args.seconds:g} s\n\n"
        f"`{report['command']}` on {report['machine']}\n\n"
        f"Capacity (closed loop, 8 in flight): {per_s:.2f} req/s of {BATCH} short texts.\n\n"
        + "\n".join(rows)
        + "\n"
    )
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
