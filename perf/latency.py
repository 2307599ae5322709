"""Where a request's time goes at low load: the client's latency against the worker's
queue and inference times (its `x-queue-time` and `x-inference-time` headers) and the
same texts' tokenize + forward pass in process, through the same adapter and profile.

    .venv/bin/python -m perf latency [--requests 200] [--texts 8] [--profile k=v,...]

One stack (nats-server, one encoder worker, the gateway) on loopback; requests one after
another, 20 ms apart, so nothing queues. What is left after the forward pass is the
worker's coalescing wait (`max_wait_ms`), the queue hops, the gateway and the client.
Results: perf/results/latency-<time>.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.knee import _profile_arg  # noqa: E402
from perf.reports import save_report  # noqa: E402
from perf.stack import local_stack  # noqa: E402
from perf.texts import load  # noqa: E402
from perf.workloads import minilm_adapter, minilm_rows  # noqa: E402
from shoal.tune.machine import machine  # noqa: E402
from tests.helpers import MINILM_SPEC, MODEL  # noqa: E402


def _served(base: str, batches: list[list[str]]) -> dict[str, list[float]]:
    import httpx

    out: dict[str, list[float]] = {"client": [], "queue": [], "inference": []}
    with httpx.Client(base_url=base, timeout=30) as http:
        for batch in batches[:20]:  # warm: first compiles, connection set-up
            http.post("/v1/embeddings", json={"model": MODEL, "input": batch})
        for batch in batches:
            started = time.perf_counter()
            r = http.post("/v1/embeddings", json={"model": MODEL, "input": batch})
            r.raise_for_status()
            out["client"].append((time.perf_counter() - started) * 1000)
            out["queue"].append(float(r.headers["x-queue-time"]))
            out["inference"].append(float(r.headers["x-inference-time"]))
            time.sleep(0.02)
    return out


def _in_process(batches: list[list[str]], profile: dict) -> tuple[list[float], str]:
    import msgspec

    spec = msgspec.structs.replace(
        MINILM_SPEC, profile=msgspec.structs.replace(MINILM_SPEC.profile, **profile)
    )
    adapter = minilm_adapter("cpu", spec)
    times = []
    for batch in batches[:20] + batches:
        started = time.perf_counter()
        adapter.forward("embed", minilm_rows(adapter, batch))
        times.append((time.perf_counter() - started) * 1000)
    return times[20:], adapter.engine()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf latency")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--texts", type=int, default=8, help="short texts per request")
    parser.add_argument("--profile", type=_profile_arg, default={})
    parser.add_argument("--out", default=str(ROOT / "perf" / "results"))
    args = parser.parse_args(argv)
    texts = load("short")
    batches = [
        [texts[(i * args.texts + j) % len(texts)] for j in range(args.texts)]
        for i in range(args.requests)
    ]
    with local_stack(args.profile) as stack:
        served = _served(stack.base, batches)
    forward, engine = _in_process(batches, args.profile)
    p50 = {
        name: round(statistics.median(xs), 1) for name, xs in {**served, "forward": forward}.items()
    }
    report = {
        "command": "python -m perf latency " + " ".join(argv),
        "machine": machine(),
        "engine": engine,
        "p50_ms": p50,
        "client_minus_forward_ms": round(p50["client"] - p50["forward"], 1),
    }
    m = report["machine"]
    md = (
        f"`{report['command']}` on {m['cpu']} ({m['cores']} cores; {m.get('flags', '')}), "
        f"engine {engine}, {args.requests} requests of {args.texts} short texts, p50:\n\n"
        "| | ms |\n|---|---|\n"
        f"| client latency | {p50['client']} |\n"
        f"| worker: published to pulled (`x-queue-time`) | {p50['queue']} |\n"
        f"| worker: pulled to answered (`x-inference-time`) | {p50['inference']} |\n"
        f"| in process: tokenize + forward, same adapter | {p50['forward']} |\n"
        f"| client minus forward | {report['client_minus_forward_ms']} |\n"
    )
    save_report(args.out, "latency", report, md)
