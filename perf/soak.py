"""`python -m perf soak --minutes N [--rate R] [--faults all|NAMES] [--batch-lines K]`:
Shoal under the mix its users send, for N minutes, with faults while it is busy.

Real processes on loopback: nats-server, an encoder worker (MiniLM and a reranker), a
generation worker (SmolLM2 on its OpenVINO host process) and a gateway. Live traffic at
`--rate` requests/s (soak_load.SHARES: embeddings, streamed chat, rerank, native bulk,
Responses with a tool) plus one Batches API job of synthetic chat lines. With `--faults`,
each named fault once, evenly spaced: kill -9 the encoder worker, the OpenVINO host, the
generation worker, the gateway, nats-server (each process but the host is started again,
as an orchestrator would; the host is the generation worker's own to restart).

Every 10 s it records each process's RSS and open descriptors, per-route p50/p99 and
statuses, the work stream's depth and JetStream's streams, consumers and bytes. At the
end: every 2xx answer whole, every batch line answered once, each fault's recovery (its
first success on every route after it), each route's p99 over the first and the last 10
minutes. Writes perf/results/soak-<time>.{json,md,png}; `verdict()` says what missed the
issue's bar.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.soak_load import RERANKER, SHARES, Sent, Traffic, batch_lines  # noqa: E402
from shoal.queue.embedded import EmbeddedNats, free_port  # noqa: E402
from shoal.tune.knee import quantile  # noqa: E402
from shoal.tune.machine import machine  # noqa: E402
from tests.helpers import (  # noqa: E402
    GEN_MODEL,
    MODEL,
    ShoalProcess,
    model_ready,
    shoal_env,
    start_worker,
    wait_until,
)

FAULTS = ("encoder", "openvino-host", "generator", "gateway", "nats-server")
SAMPLE_S = 10.0
WARM_UP_S = 60.0
"""The first minute: models resident, connections open, the first batches compiled."""
GRACE_S = 5.0
"""After a fault's recovery, seconds in which its errors still count as the fault's."""


class Cluster:
    """The soak's processes, each restartable on the same port and data."""

    def __init__(self, root: Path) -> None:
        from tests.task_models import build_task_models

        self.root = root
        self.env = {
            "SHOAL_MODELS_FILE": str(build_task_models(root / "task-models")),
            "SHOAL_WORKER__PINNED": f"{MODEL},{RERANKER}",
        }
        self.nats = EmbeddedNats(root / "nats", port=free_port())
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, ShoalProcess] = {}

    def start(self) -> None:
        self.nats.start()
        self._start("encoder")
        self._start("generator")
        self._start("gateway")
        for model in (MODEL, RERANKER, GEN_MODEL):
            wait_until(lambda m=model: model_ready(self.base, m), 600, None, f"{model} ready")
        # What the soak measures is the default engine: say so now, not at the host's fault
        # (a missing optimum export falls back to transformers, which has no host).
        engines = {
            m["id"]: m.get("engine", "")
            for m in httpx.get(f"{self.base}/v1/models", timeout=10).json()["data"]
        }
        if not engines.get(GEN_MODEL, "").startswith("openvino"):
            raise RuntimeError(f"{GEN_MODEL} is not served by OpenVINO: {engines.get(GEN_MODEL)}")

    def _start(self, role: str) -> None:
        if role == "gateway":
            env = shoal_env(self.nats.url, self.root, self.env)
            log = self.root / f"gateway-{time.monotonic_ns()}.log"
            self.procs[role] = ShoalProcess(["gateway", "--port", str(self.port)], env, log)
            return
        kind, models = ("generate", GEN_MODEL) if role == "generator" else ("encode", None)
        self.procs[role] = start_worker(
            self.nats.url,
            self.root,
            models=models or f"{MODEL},{RERANKER}",
            extra=self.env,
            name=role,
            kind=kind,
        )

    def inject(self, fault: str) -> None:
        """kill -9 what `fault` names; start it again (the host: its worker does)."""
        if fault == "nats-server":
            self.nats.kill()
            self.nats.start()
        elif fault == "openvino-host":
            hosts = _children(self.procs["generator"].pid)
            if not hosts:
                raise RuntimeError("the generation worker has no OpenVINO host to kill")
            for pid in hosts:
                os.kill(pid, 9)
        else:
            self.procs[fault].kill()
            self._start(fault)

    def pids(self) -> dict[str, int]:
        pids = {role: p.pid for role, p in self.procs.items()}
        if self.nats.process is not None:
            pids["nats-server"] = self.nats.process.pid
        for i, pid in enumerate(_children(pids["generator"])):
            pids[f"openvino-host-{i}" if i else "openvino-host"] = pid
        return pids

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.stop()
        self.nats.stop()


def _children(pid: int) -> list[int]:
    """`pid`'s OpenVINO host processes: its children started by multiprocessing's spawn
    (from any of its threads; not its resource tracker)."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tasks:
        try:
            children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in cmdline:
                found.append(child)
    return sorted(found)


def process_usage(pid: int) -> tuple[int, int]:
    """(RSS in KiB, open descriptors) of `pid`; zeros when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration, ValueError):
        return 0, 0


async def _quiet(_: Exception) -> None:
    pass


class JetStreamProbe:
    """The JetStream state a leak would show in: the work stream's depth, and the
    account's streams, consumers and bytes held (file and memory). One connection for the
    whole run, reconnecting after the nats-server fault, so the probe itself adds no
    connection churn to the server it measures. Empty while the server is down."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.nc = None

    async def state(self) -> dict:
        import nats

        try:
            if self.nc is None or self.nc.is_closed:
                self.nc = await nats.connect(
                    self.url,
                    connect_timeout=2,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=1,
                    error_cb=_quiet,  # the nats-server fault is expected
                )
            js = self.nc.jetstream(timeout=2)
            account = await js.account_info()
            work = await js.stream_info("SHOAL_WORK")
        except Exception:
            return {}
        return {
            "stream_messages": work.state.messages,
            "streams": account.streams,
            "consumers": account.consumers,
            "storage_bytes": account.storage,
            "memory_bytes": account.memory,
        }

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            await self.nc.close()


async def soak(
    cluster: Cluster, minutes: float, rate: float, faults: list[str], lines: int
) -> dict:
    seconds = minutes * 60
    traffic = Traffic(cluster.base)
    schedule = [
        (seconds * (0.15 + 0.7 * i / max(1, len(faults) - 1)), f) for i, f in enumerate(faults)
    ]
    if len(faults) == 1:
        schedule = [(seconds / 2, faults[0])]
    samples: list[dict] = []
    injected: list[dict] = []
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=100)
    probe = JetStreamProbe(cluster.nats.url)
    async with httpx.AsyncClient(base_url=cluster.base, timeout=60, limits=limits) as client:
        batch_id = await _start_batch(client, lines)
        began = time.monotonic()
        pending: set[asyncio.Task] = set()
        next_sample, slots, skipped = SAMPLE_S, 0, 0
        while (now := time.monotonic() - began) < seconds:
            while schedule and schedule[0][0] <= now:
                _, fault = schedule.pop(0)
                await asyncio.to_thread(cluster.inject, fault)
                injected.append({"fault": fault, "at": now})
                print(f"soak: {now:6.1f} s: {fault} killed", flush=True)
            if now >= next_sample:
                samples.append(await _sample(cluster, traffic.sent, now, probe))
                next_sample += SAMPLE_S
            slots += 1
            if len(pending) < 400:  # bounded: a stalled server holds at most this many
                task = asyncio.create_task(traffic.send(client, traffic.pick(), began))
                pending.add(task)
                task.add_done_callback(pending.discard)
            else:
                skipped += 1
            await asyncio.sleep(max(0.0, slots / rate - (time.monotonic() - began)))
        if pending:
            await asyncio.wait(pending, timeout=90)
        batch = await _finish_batch(client, batch_id, lines, deadline=time.monotonic() + 900)
    await probe.close()
    report = _report(traffic.sent, samples, injected, batch, minutes, rate)
    report["skipped"] = skipped  # not sent: 400 already waiting
    return report


async def _sample(cluster: Cluster, sent: list[Sent], now: float, probe: JetStreamProbe) -> dict:
    window = [s for s in sent if s.status and now - SAMPLE_S <= s.started + s.seconds <= now]
    routes = {}
    for route in SHARES:
        ok = [s.seconds for s in window if s.route == route and 200 <= s.status < 300]
        routes[route] = {"ok": len(ok), "p50": quantile(ok, 0.5), "p99": quantile(ok, 0.99)}
    statuses: dict[str, int] = {}
    for s in window:
        statuses[str(s.status)] = statuses.get(str(s.status), 0) + 1
    pids = cluster.pids()
    usage = {role: process_usage(pid) for role, pid in pids.items()}
    return {
        "t": now,
        "pids": pids,
        "rss_kib": {role: u[0] for role, u in usage.items()},
        "fds": {role: u[1] for role, u in usage.items()},
        "routes": routes,
        "statuses": statuses,
        **await probe.state(),
    }


async def _start_batch(client: httpx.AsyncClient, lines: int) -> str | None:
    if not lines:
        return None
    files = {"file": ("soak.jsonl", io.BytesIO(batch_lines(lines)), "application/jsonl")}
    uploaded = await client.post("/v1/files", data={"purpose": "batch"}, files=files)
    uploaded.raise_for_status()
    body = {
        "input_file_id": uploaded.json()["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    created = await client.post("/v1/batches", json=body)
    created.raise_for_status()
    return created.json()["id"]


async def _finish_batch(
    client: httpx.AsyncClient, batch_id: str | None, lines: int, deadline: float
) -> dict:
    if batch_id is None:
        return {"lines": 0}
    batch: dict = {}
    while time.monotonic() < deadline:
        try:
            batch = (await client.get(f"/v1/batches/{batch_id}")).json()
        except httpx.HTTPError:
            batch = {}
        if batch.get("status") in ("completed", "failed", "expired", "cancelled"):
            break
        await asyncio.sleep(2)
    result = {"lines": lines, "status": batch.get("status"), "counts": batch.get("request_counts")}
    if batch.get("completed_at") and batch.get("created_at"):  # when live traffic had it beside
        result["ran_s"] = batch["completed_at"] - batch["created_at"]
    if batch.get("output_file_id"):
        out = await client.get(f"/v1/files/{batch['output_file_id']}/content")
        ids = [json.loads(line) for line in out.text.splitlines() if line.strip()]
        answered = [
            r["custom_id"] for r in ids if (r.get("response") or {}).get("status_code") == 200
        ]
        result["answered_once"] = len(set(answered)) == len(answered) == lines
        result["answered"] = len(set(answered))
    return result


def _report(
    sent: list[Sent],
    samples: list[dict],
    injected: list[dict],
    batch: dict,
    minutes: float,
    rate: float,
) -> dict:
    for fault in injected:
        firsts = {}
        for route in SHARES:
            after = [
                s.started + s.seconds - fault["at"]
                for s in sent
                if s.route == route and s.started >= fault["at"] and 200 <= s.status < 300
            ]
            firsts[route] = min(after) if after else None
        fault["first_success_s"] = firsts
        known = [v for v in firsts.values() if v is not None]
        fault["recovery_s"] = max(known) if len(known) == len(firsts) else None
    windows = [
        (f["at"], f["at"] + (f["recovery_s"] if f["recovery_s"] is not None else 1e9) + GRACE_S)
        for f in injected
    ]

    def in_fault(s: Sent) -> bool:
        """Running when a fault struck, or started before its recovery and grace."""
        ended = s.started + s.seconds
        return any(s.started <= a <= ended or a <= s.started <= b for a, b in windows)

    totals: dict[str, dict[str, int]] = {}
    for s in sent:
        by = totals.setdefault(s.route, {})
        by[str(s.status)] = by.get(str(s.status), 0) + 1
    problems = [
        f"{s.route} at {s.started:.1f} s: {s.problem}"
        for s in sent
        if s.status // 100 == 2 and s.problem
    ]
    failed_outside = [
        f"{s.route} at {s.started:.1f} s: {s.status or s.problem}"
        for s in sent
        if (s.status >= 500 or s.status == 0) and not in_fault(s)
    ]
    return {
        "minutes": minutes,
        "rate": rate,
        "sent": len(sent),
        "p99_windows": _p99_windows([s for s in sent if not in_fault(s)], minutes * 60),
        "totals": totals,
        "problems": problems[:100],
        "problem_count": len(problems),
        "failed_outside_faults": failed_outside[:100],
        "failed_outside_count": len(failed_outside),
        "faults": injected,
        "batch": batch,
        "samples": samples,
    }


def _p99_windows(calm: list[Sent], seconds: float) -> dict[str, dict]:
    """Each route's p99 over every answer of the first 10 minutes after warm-up (the first
    minute) and of the last 10, fault windows left out of both: the issue's "p99 in the
    last 10 minutes", not a median of 10-s samples (each of which holds a dozen chats, so
    its p99 is their slowest)."""
    windows = {"first": (WARM_UP_S, WARM_UP_S + 600), "last": (seconds - 600, seconds)}
    out: dict[str, dict] = {}
    for route in SHARES:
        out[route] = {}
        for name, (a, b) in windows.items():
            ok = [
                s.seconds
                for s in calm
                if s.route == route and a <= s.started < b and 200 <= s.status < 300
            ]
            out[route][name] = {"n": len(ok), "p99": quantile(ok, 0.99)}
    return out


def _growth(points: list[tuple[float, int]]) -> float | None:
    """A life's RSS growth from 10 minutes after its start to its end: the median of its
    last 5 minutes against that of its first 5 so judged (a garbage-collected process,
    nats-server's Go heap, swings by a few percent between two single samples)."""
    judged = [(t, rss) for t, rss in points if t >= points[0][0] + 600 and rss]
    if len(judged) < 2:
        return None
    window = min(300.0, (judged[-1][0] - judged[0][0]) / 3)
    first = [rss for t, rss in judged if t <= judged[0][0] + window]
    last = [rss for t, rss in judged if t >= judged[-1][0] - window]
    return quantile(last, 0.5) / quantile(first, 0.5) - 1


def rss_growth(samples: list[dict]) -> list[tuple[str, int, float | None]]:
    """Each life of each process (a fault restarts some) with its RSS growth after its
    first 10 minutes (None: a shorter life). A generation host's paged KV cache fills for
    minutes after its start."""
    lives: dict[tuple[str, int], list[tuple[float, int]]] = {}
    for sample in samples:
        for role, pid in sample["pids"].items():
            if role in sample["rss_kib"]:
                lives.setdefault((role, pid), []).append((sample["t"], sample["rss_kib"][role]))
    return [(role, pid, _growth(points)) for (role, pid), points in lives.items()]


def verdict(report: dict) -> list[str]:
    """What misses the issue's bar (empty: it passed). Timing checks only where the soak
    was long enough for them (RSS: past 20 minutes; p99: past 30)."""
    misses = []
    if report["problem_count"]:
        misses.append(f"{report['problem_count']} answers not whole: {report['problems'][:5]}")
    if report["failed_outside_count"]:
        misses.append(f"{report['failed_outside_count']} failures outside fault windows")
    batch = report["batch"]
    if batch["lines"] and not batch.get("answered_once"):
        misses.append(f"batch: {batch}")
    for fault in report["faults"]:
        if fault["recovery_s"] is None or fault["recovery_s"] > 30:
            misses.append(f"{fault['fault']}: recovery {fault['recovery_s']}")
    if report["minutes"] >= 20:
        for role, _, grew in rss_growth(report["samples"]):
            if grew is not None and grew > 0.05:
                misses.append(f"{role} RSS grew {grew:.1%}")
    if report["minutes"] >= 30:
        for route, window in report["p99_windows"].items():
            a, b = window["first"]["p99"], window["last"]["p99"]
            if a and b and b > 1.2 * a:
                misses.append(f"{route}: p99 {b:.2f} s in the last 10 min against {a:.2f} s")
    return misses


def write(report: dict, out: Path, argv: list[str]) -> Path:
    """The report as JSON, a Markdown summary and a plot (RSS and p99 against time)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = out / f"soak-{stamp}"
    path.with_suffix(".json").write_text(json.dumps(report, indent=1))
    misses = verdict(report)
    lines = [
        "# Soak",
        "",
        f"`python -m perf soak {' '.join(argv)}`: {report['minutes']:g} min at {report['rate']:g}"
        f" requests/s, {report['sent']} requests ({_machine()}).",
        "",
        "| route | statuses |",
        "|---|---|",
        *(f"| {route} | {counts} |" for route, counts in report["totals"].items()),
        "",
        "| fault | at (s) | recovery (s): first success on every route |",
        "|---|---|---|",
        *(f"| {f['fault']} | {f['at']:.0f} | {f['recovery_s']} |" for f in report["faults"]),
        "",
        "| route | p99 first 10 min (s) | p99 last 10 min (s) | answers |",
        "|---|---|---|---|",
        *(
            f"| {route} | {_s(w['first']['p99'])} | {_s(w['last']['p99'])} |"
            f" {w['first']['n']} / {w['last']['n']} |"
            for route, w in report["p99_windows"].items()
        ),
        "",
        "| process (pid) | RSS growth after its first 10 minutes |",
        "|---|---|",
        *(
            f"| {role} ({pid}) | {'-' if grew is None else f'{grew:+.1%}'} |"
            for role, pid, grew in rss_growth(report["samples"])
        ),
        "",
        f"Batch: {report['batch']}. Answers not whole: {report['problem_count']}. Failures"
        f" outside fault windows: {report['failed_outside_count']}.",
        "",
        "Verdict: " + ("passed" if not misses else "; ".join(misses)),
    ]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    _plot(report, path.with_suffix(".png"))
    return path


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def _machine() -> str:
    m = machine()
    return f"{m['cpu']}, {m['cores']} cores, {m['flags']}"


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    if not samples:
        return
    fig, (rss, p99) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    t = [s["t"] / 60 for s in samples]
    for role in samples[-1]["rss_kib"]:
        rss.plot(t, [s["rss_kib"].get(role, 0) / 1024 for s in samples], label=role)
    for route in SHARES:
        p99.plot(t, [s["routes"][route]["p99"] for s in samples], label=route)
    for fault in report["faults"]:
        for ax in (rss, p99):
            ax.axvline(fault["at"] / 60, color="red", alpha=0.4)
        rss.annotate(fault["fault"], (fault["at"] / 60, 0), rotation=90, fontsize=7)
    rss.set_ylabel("RSS (MiB)")
    p99.set_ylabel("p99 (s)")
    p99.set_xlabel("minutes")
    rss.legend(fontsize=7)
    p99.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf soak")
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=8.0, help="live requests/s (8)")
    parser.add_argument("--faults", default="", help=f"all, or some of {','.join(FAULTS)}")
    parser.add_argument("--batch-lines", type=int, default=200)
    parser.add_argument("--out", type=Path, default=ROOT / "perf/results")
    args = parser.parse_args(argv)
    faults = list(FAULTS) if args.faults == "all" else [f for f in args.faults.split(",") if f]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp))
        try:
            cluster.start()
            report = asyncio.run(soak(cluster, args.minutes, args.rate, faults, args.batch_lines))
        finally:
            cluster.stop()
    path = write(report, args.out, argv)
    misses = verdict(report)
    print(f"soak: wrote {path}.md: " + ("passed" if not misses else "; ".join(misses)))
    sys.exit(1 if misses else 0)
