"""`python -m perf slow-clients [--idle 2000] [--slow-readers 200] [--trickles 50]`:
live traffic beside clients that hold connections and read or send nothing (#42 item 4).

The soak's processes (perf.soak.Cluster) on loopback. Live traffic: embeddings at
`--rate` requests/s and a streamed chat every 2 s (its time to first token). Three phases:
`--calm` seconds of live traffic alone, `--seconds` with the offenders, `--calm` after.
The offenders, from a process of their own (in the live load's, their bursts of socket
work would stall its event loop and count as the gateway's latency):

- `--idle` TCP connections opened and never written to; each one the gateway closes is
  opened again, so that many stay open against it the whole phase;
- `--slow-readers` streamed chats (`--reader-tokens` tokens each), started 10 a second,
  whose answers are read one byte a second;
- `--trickles` requests whose head promises a 2 kB body that then comes a byte a second.

Every second it samples the gateway's RSS and open descriptors. The report: live p50/p99
per phase and the offender phase's p99 against the first calm one, the gateway's
resources per phase, and what happened to each kind of offender (when the gateway
closed it, with what status). Writes perf/results/slow-clients-<time>.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import tempfile
import time
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.soak import Cluster, process_usage  # noqa: E402
from shoal.tune.knee import quantile  # noqa: E402
from shoal.tune.machine import machine  # noqa: E402
from tests.helpers import GEN_MODEL, MODEL, raw_status  # noqa: E402

READ_LIMIT_S = 120.0
"""A slow reader stops reading after this (it has shown what the gateway does by then)."""


class Offenders:
    """What happened to each kind of offender: seconds from its first byte sent (or its
    connection) to the gateway closing it, and the status it was answered with."""

    def __init__(self) -> None:
        self.idle_closed: list[float] = []
        self.reader_outcomes: list[dict] = []
        self.trickle_outcomes: list[dict] = []


async def _idle(host: str, port: int, until: float, found: Offenders) -> None:
    """One idle connection, opened again whenever the gateway closes it, until `until`."""
    while time.monotonic() < until:
        opened = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(1.0)
            continue
        try:
            await asyncio.wait_for(reader.read(1 << 16), timeout=until - time.monotonic())
            found.idle_closed.append(time.monotonic() - opened)
        except (TimeoutError, OSError):
            pass
        finally:
            writer.close()


def _head(path: str, port: int, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {length}\r\n\r\n"
    ).encode()


async def _slow_reader(host: str, port: int, tokens: int, found: Offenders) -> None:
    """A streamed chat whose answer is read a byte a second."""
    body = json.dumps(
        {
            "model": GEN_MODEL,
            "stream": True,
            "max_tokens": tokens,
            "messages": [{"role": "user", "content": "Tell me a long story about a river."}],
        }
    ).encode()
    reader, writer = await asyncio.open_connection(host, port)
    began, got = time.monotonic(), b""
    writer.write(_head("/v1/chat/completions", port, len(body)) + body)
    try:
        while time.monotonic() - began < READ_LIMIT_S:
            byte = await reader.read(1)
            if not byte:
                break
            got += byte
            await asyncio.sleep(1.0)
    except OSError:
        pass
    finally:
        writer.close()
    status = str(raw_status(got) or "none")
    found.reader_outcomes.append(
        {"status": status, "closed_after_s": round(time.monotonic() - began, 1)}
    )


async def _trickle(host: str, port: int, found: Offenders) -> None:
    """A request whose 2 kB body comes a byte a second."""
    reader, writer = await asyncio.open_connection(host, port)
    began = time.monotonic()
    writer.write(_head("/v1/embeddings", port, 2000))
    answer = b""
    try:
        for _ in range(2000):
            writer.write(b" ")
            await writer.drain()
            try:
                answer = await asyncio.wait_for(reader.read(4096), timeout=1.0)
            except TimeoutError:
                continue
            break
    except OSError:
        pass
    finally:
        writer.close()
    status = str(raw_status(answer) or "cut")
    found.trickle_outcomes.append({"status": status, "after_s": round(time.monotonic() - began, 1)})


async def _live(base: str, rate: float, until: float, out: list[dict], began: float) -> None:
    """Embeddings at `rate` a second, a streamed chat every 2 s (its first token's time)."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:

        async def embed() -> None:
            t0 = time.monotonic()
            try:
                r = await client.post("/v1/embeddings", json={"model": MODEL, "input": "a river"})
                status = r.status_code
            except httpx.HTTPError:
                status = 0
            out.append({"route": "embeddings", "at": t0 - began, "s": time.monotonic() - t0,
                        "status": status})  # fmt: skip

        async def chat() -> None:
            t0, first, status = time.monotonic(), None, 0
            body = {"model": GEN_MODEL, "stream": True, "max_tokens": 8,
                    "messages": [{"role": "user", "content": "Say hi."}]}  # fmt: skip
            try:
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    status = r.status_code
                    async for _ in r.aiter_lines():
                        first = first or time.monotonic()
            except httpx.HTTPError:
                status = 0
            out.append({"route": "chat_ttft", "at": t0 - began,
                        "s": (first or time.monotonic()) - t0, "status": status})  # fmt: skip

        tasks, n = set(), 0
        start = time.monotonic()
        while time.monotonic() < until:
            n += 1
            for make in [embed] + ([chat] if n % max(1, int(2 * rate)) == 0 else []):
                task = asyncio.create_task(make())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.sleep(max(0.0, start + n / rate - time.monotonic()))
        if tasks:
            await asyncio.wait(tasks, timeout=90)


async def _sample(pid: int, until: float, out: list[dict], began: float) -> None:
    while time.monotonic() < until:
        rss, fds = process_usage(pid)
        out.append({"at": round(time.monotonic() - began, 1), "rss_kib": rss, "fds": fds})
        await asyncio.sleep(1.0)


async def _offend(port: int, args: argparse.Namespace) -> Offenders:
    """Every offender, for `args.seconds` (the slow readers up to `READ_LIMIT_S`)."""
    host, found = "127.0.0.1", Offenders()
    until = time.monotonic() + args.seconds
    offenders = [asyncio.create_task(_idle(host, port, until, found))
                 for _ in range(args.idle)]  # fmt: skip
    offenders += [asyncio.create_task(_trickle(host, port, found)) for _ in range(args.trickles)]
    for _ in range(args.slow_readers):
        offenders.append(asyncio.create_task(_slow_reader(host, port, args.reader_tokens, found)))
        await asyncio.sleep(0.1)
    await asyncio.wait(offenders, timeout=max(args.seconds, READ_LIMIT_S) + 30)
    for task in offenders:
        task.cancel()
    return found


def _offender_process(port: int, args: argparse.Namespace, conn: Connection) -> None:
    """The offenders in a process of their own: thousands of sockets reopened at once
    stall an event loop for a while, and in the live load's loop that stall would be
    counted as the gateway's latency."""
    conn.send(vars(asyncio.run(_offend(port, args))))


async def run(cluster: Cluster, args: argparse.Namespace) -> dict:
    began = time.monotonic()
    end = began + args.calm + args.seconds + args.calm
    live: list[dict] = []
    samples: list[dict] = []
    background = [
        asyncio.create_task(_live(cluster.base, args.rate, end, live, began)),
        asyncio.create_task(_sample(cluster.procs["gateway"].pid, end, samples, began)),
    ]
    await asyncio.sleep(args.calm)
    receive, send = multiprocessing.get_context("spawn").Pipe(duplex=False)
    offender = multiprocessing.get_context("spawn").Process(
        target=_offender_process, args=(cluster.port, args, send), daemon=True
    )
    offender.start()
    await asyncio.gather(*background)
    found = Offenders()
    if await asyncio.to_thread(receive.poll, READ_LIMIT_S + 60):
        vars(found).update(receive.recv())
    offender.join(10)
    if offender.is_alive():
        offender.kill()
    phases = {
        "calm before": (0.0, args.calm),
        "offenders": (args.calm, args.calm + args.seconds),
        "calm after": (args.calm + args.seconds, end - began),
    }
    return _report(args, phases, live, samples, found)


def _report(args, phases, live, samples, found: Offenders) -> dict:
    def within(rows, lo, hi):
        return [r for r in rows if lo <= r["at"] < hi]

    table = {}
    for phase, (lo, hi) in phases.items():
        rows = within(live, lo, hi)
        cell = {"gateway_rss_mib_max": 0.0, "gateway_fds_max": 0}
        for route in ("embeddings", "chat_ttft"):
            secs = sorted(r["s"] for r in rows if r["route"] == route and r["status"] == 200)
            cell[route] = {
                "n": sum(1 for r in rows if r["route"] == route),
                "ok": len(secs),
                "p50_ms": round(1000 * quantile(secs, 0.5), 1) if secs else None,
                "p99_ms": round(1000 * quantile(secs, 0.99), 1) if secs else None,
            }
        held = within(samples, lo, hi)
        if held:
            cell["gateway_rss_mib_max"] = round(max(s["rss_kib"] for s in held) / 1024, 1)
            cell["gateway_fds_max"] = max(s["fds"] for s in held)
        table[phase] = cell
    calm, busy = table["calm before"], table["offenders"]
    ratios = {
        route: round(busy[route]["p99_ms"] / calm[route]["p99_ms"], 2)
        for route in ("embeddings", "chat_ttft")
        if busy[route]["p99_ms"] and calm[route]["p99_ms"]
    }

    def counts(rows: list[dict]) -> dict:
        return dict(Counter(r["status"] for r in rows))

    closed = sorted(found.idle_closed)
    return {
        "machine": machine(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "phases": table,
        "p99_ratio_offenders_vs_calm": ratios,
        "idle": {
            "closed": len(closed),
            "closed_after_s_p50": round(quantile(closed, 0.5), 1) if closed else None,
            "closed_after_s_max": round(closed[-1], 1) if closed else None,
        },
        "slow_readers": {
            "statuses": counts(found.reader_outcomes),
            "closed_after_s_max": max(
                (r["closed_after_s"] for r in found.reader_outcomes), default=None
            ),
        },
        "trickles": {
            "statuses": counts(found.trickle_outcomes),
            "after_s_max": max((r["after_s"] for r in found.trickle_outcomes), default=None),
        },
        "samples": samples,
    }


def _markdown(report: dict) -> str:
    a = report["args"]
    lines = [
        f"# Slow and idle clients beside live traffic ({report['machine']})",
        "",
        f"`python -m perf slow-clients --idle {a['idle']} --slow-readers {a['slow_readers']} "
        f"--trickles {a['trickles']} --seconds {a['seconds']:g} --rate {a['rate']:g}`",
        "",
        "| phase | embeddings p50 / p99 ms | chat TTFT p50 / p99 ms | ok / sent | "
        "gateway RSS max MiB | gateway fds max |",
        "|---|---|---|---|---|---|",
    ]
    for phase, c in report["phases"].items():
        e, t = c["embeddings"], c["chat_ttft"]
        lines.append(
            f"| {phase} | {e['p50_ms']} / {e['p99_ms']} | {t['p50_ms']} / {t['p99_ms']} | "
            f"{e['ok'] + t['ok']} / {e['n'] + t['n']} | {c['gateway_rss_mib_max']} | "
            f"{c['gateway_fds_max']} |"
        )
    lines += [
        "",
        f"p99 with the offenders against calm: {report['p99_ratio_offenders_vs_calm']}",
        f"Idle connections: {report['idle']}",
        f"Slow readers: {report['slow_readers']}",
        f"Trickled bodies: {report['trickles']}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf slow-clients")
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--slow-readers", type=int, default=200)
    parser.add_argument("--reader-tokens", type=int, default=32)
    parser.add_argument("--trickles", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=80.0, help="with the offenders")
    parser.add_argument("--calm", type=float, default=40.0, help="before and after them")
    parser.add_argument("--rate", type=float, default=10.0, help="live embeddings/s")
    parser.add_argument("--out", type=Path, default=ROOT / "perf/results")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp))
        try:
            cluster.start()
            report = asyncio.run(run(cluster, args))
        finally:
            cluster.stop()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"slow-clients-{stamp}.json").write_text(json.dumps(report, indent=1))
    (args.out / f"slow-clients-{stamp}.md").write_text(_markdown(report))
    print(_markdown(report))
