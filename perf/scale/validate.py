"""The simulator against reality, where reality fits on this machine.

For each worker count W: a real nats-server and gateway, W real encoder workers of the
dummy runtime whose forward pass sleeps along the calibrated curve (slowed down so that W
of them stay below what the gateway and the load generator can drive on these cores), and
the knee measured as `perf knee` measures it (open loop, p99 bound). Once with Shoal's
pull (every worker pulls the one model's shared queue), once per push policy (a real push
router, perf/scale/router.py, in front of the same workers, each with a queue of its
own). The simulator then runs the same scenario at the same offered rates and its knee is
set beside the measured one.

Before the knees, 30 sequential one-text requests at idle measure what a request costs
beyond its forward pass (HTTP, gateway, queue, client: the simulator's `overhead_s`) and
what the router's hop adds: calibration, not the result.

    .venv/bin/python -m perf scale validate [--workers 4,8,16] [--policies pull,least-outstanding]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from perf.scale.sim import Curve, QueueCosts, Scenario, run_step  # noqa: E402
from perf.stack import peer_server  # noqa: E402
from perf.texts import load  # noqa: E402
from shoal.queue.embedded import EmbeddedNats, free_port  # noqa: E402
from shoal.tune.knee import Load, describe, find_knee, kept_up  # noqa: E402
from shoal.tune.machine import machine  # noqa: E402
from shoal.workers.encoder.schedule import PULL_HORIZON  # noqa: E402
from tests.helpers import start_gateway, start_worker, wait_until  # noqa: E402

FRACTIONS = (0.3, 0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5)
MAX_LENGTH = 256
MODEL = "sleep"


def dummy_length(text: str) -> int:
    """Tokens the dummy runtime counts for a text: its words, CLS and SEP, capped."""
    return min(MAX_LENGTH, len(text.split()) + 2)


def bodies(count: int, passage_share: float, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    short, passages = load("short"), load("passages")
    out = []
    for _ in range(count):
        pool = passages if rng.random() < passage_share else short
        texts = [pool[i] for i in rng.integers(0, len(pool), size=int(rng.integers(1, 9)))]
        out.append({"model": MODEL, "input": texts, "encoding_format": "base64"})
    return out


def models_file(directory: Path, curve: Curve, workers: int) -> Path:
    source = f"sleep:{curve.base_s * 1e3},{curve.per_row_s * 1e3},{curve.per_token_s * 1e3}"
    lines = []
    for name in [MODEL, *(f"{MODEL}-w{i}" for i in range(workers))]:
        lines += [
            "[[models]]",
            f'id = "{name}"',
            'tasks = ["embed"]',
            f'source = "{source}"',
            'runtime = "dummy"',
            "dims = 8",
            f"max_length = {MAX_LENGTH}",
        ]
    path = directory / "models.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@contextlib.contextmanager
def fleet(curve: Curve, workers: int, policy: str) -> Iterator[tuple[str, str]]:
    """nats-server, a gateway and `workers` sleeping workers (and a push router unless
    `policy` is pull); yields (the URL to load, the gateway's URL)."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        env = {"SHOAL_MODELS_FILE": str(models_file(data, curve, workers))}
        nats = EmbeddedNats(data / "nats").start()
        procs = []
        try:
            for i in range(workers):
                served = MODEL if policy == "pull" else f"{MODEL}-w{i}"
                procs.append(start_worker(nats.url, data, served, env, name=f"worker{i}"))
            gateway, base = start_gateway(nats.url, data, env)
            procs.append(gateway)
            served = [MODEL] if policy == "pull" else [f"{MODEL}-w{i}" for i in range(workers)]
            for model in served:  # every worker answers before the load starts
                wait_until(lambda m=model: _answers(base, m), 300, None, f"{model} answering")
            if policy == "pull":
                yield base, base
                return
            port = free_port()
            command = [sys.executable, "-m", "perf.scale.router", "--port", str(port)]
            command += ["--gateway", base, "--workers", str(workers), "--policy", policy]
            with contextlib.contextmanager(peer_server)(
                command, port, {}, 60, "push router", cwd=ROOT
            ) as url:
                yield url, base
        finally:
            for proc in procs:
                proc.stop()
            nats.stop()


def _answers(base: str, model: str) -> bool:
    try:
        r = httpx.post(base + "/v1/embeddings", json={"model": model, "input": ["hi"]}, timeout=10)
        return r.status_code == 200
    except httpx.HTTPError:
        return False


def idle_p50(url: str, text: str, model: str, workers: int) -> float:
    """Seconds, p50 of 30 sequential one-text requests, after two for each worker: a
    worker's first request costs about 19 ms more (measured at 16 workers), and in pull
    each new request goes to another worker."""
    times = []
    warm = 2 * workers
    with httpx.Client(timeout=30) as client:
        for _ in range(warm + 30):
            t0 = time.perf_counter()
            r = client.post(url + "/v1/embeddings", json={"model": model, "input": [text]})
            r.raise_for_status()
            times.append(time.perf_counter() - t0)
    return statistics.median(times[warm:])


def measure(url: str, load_bodies: list[dict], step_seconds: float, p99_bound: float) -> list:
    mean = statistics.mean(len(b["input"]) for b in load_bodies)

    def count(answer: dict) -> int:
        return len(answer["data"])

    load_ = Load(url + "/v1/embeddings", load_bodies, mean, count)  # type: ignore[arg-type]
    knee = asyncio.run(
        find_knee(
            load_,
            fractions=FRACTIONS,
            step_seconds=step_seconds,
            p99_bound=p99_bound,
            probe_seconds=4,
            half_knee=False,
            on_step=lambda s: print("   ", describe(s, "texts"), flush=True),
        )
    )
    return knee.steps


def knee_rps(steps: list, p99_bound: float) -> float:
    kept = [min(s.achieved_rps, s.offered_rps) for s in steps if kept_up(s, p99_bound)]
    return max(kept, default=0.0)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf scale validate")
    parser.add_argument("--workers", default="4,8,16")
    parser.add_argument("--policies", default="pull,least-outstanding,round-robin")
    parser.add_argument("--step-seconds", type=float, default=8.0)
    parser.add_argument("--p99-bound", type=float, default=1.0)
    parser.add_argument("--slowdown-per-worker", type=float, default=0.5)
    parser.add_argument("--passage-share", type=float, default=0.2)
    parser.add_argument(
        "--pull-anytime",
        action="store_true",
        help="simulate the pull of a Shoal before the pull horizon (a tree from before it)",
    )
    parser.add_argument(
        "--calibration", type=Path, default=ROOT / "perf/results/scale-calibration-cpu.json"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "perf/results")
    args = parser.parse_args(argv)
    calibration = json.loads(args.calibration.read_text())
    measured = Curve.calibrated(calibration, "MiniLM on this CPU")
    load_bodies = bodies(2000, args.passage_share)
    short = [dummy_length(t) for t in load("short")]
    passages = [dummy_length(t) for t in load("passages")]
    rows = []
    for workers in [int(w) for w in args.workers.split(",")]:
        factor = args.slowdown_per_worker * workers
        curve = measured.scaled(factor, f"MiniLM on this CPU, slowed {factor:g}x")
        for policy in args.policies.split(","):
            print(f"W={workers} {policy} ({curve.label})", flush=True)
            with fleet(curve, workers, policy) as (url, gateway):
                one = curve.seconds(1, short[0])
                direct = MODEL if policy == "pull" else f"{MODEL}-w0"
                overhead = idle_p50(gateway, load("short")[0], direct, workers) - one
                hop = (
                    idle_p50(url, load("short")[0], MODEL, workers) - one - overhead
                    if url != gateway
                    else 0.0
                )
                steps = measure(url, load_bodies, args.step_seconds, args.p99_bound)
            scenario = Scenario(
                workers=workers,
                models=1,
                curve=curve,
                short_lengths=short,
                passage_lengths=passages,
                passage_share=args.passage_share,
                queue=QueueCosts.calibrated(calibration),
                router_s=max(hop, 0.0) / 2,
                overhead_s=max(overhead, 0.0) + max(hop, 0.0) / 2,
                arrivals="even",
                pull_horizon_s=None if args.pull_anytime else PULL_HORIZON,
            )
            simulated = [
                run_step(scenario, policy, s.offered_rps, args.step_seconds) for s in steps
            ]
            real, sim = (
                knee_rps(steps, args.p99_bound),
                knee_rps([r.step for r in simulated], args.p99_bound),
            )
            print(
                f"  measured knee {real:.1f} req/s, simulated {sim:.1f}"
                f" ({sim / real if real else 0:.2f}x)"
            )
            rows.append(
                {
                    "workers": workers,
                    "policy": policy,
                    "curve": asdict(curve),
                    "p99_bound_s": args.p99_bound,
                    "overhead_s": overhead,
                    "router_hop_s": hop,
                    "measured_knee_rps": real,
                    "simulated_knee_rps": sim,
                    "measured_steps": [asdict(s) for s in steps],
                    "simulated_steps": [
                        asdict(r.step) | {"utilization": r.utilization} for r in simulated
                    ],
                }
            )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out / f"scale-validate-{stamp}"
    out.with_suffix(".json").write_text(json.dumps({"machine": machine(), "runs": rows}, indent=1))
    lines = [
        "# Scale simulator against the real stack",
        "",
        f"`python -m perf scale validate {' '.join(argv)}` on {machine()['cpu']} "
        f"({machine()['cores']} cores; {machine()['flags']}). Dummy workers sleep along the "
        "calibrated MiniLM CPU curve, slowed by the factor shown; 20% of requests are "
        "passages, 1-8 texts each; knee: best requests/s of a step that answered 90% within "
        "the p99 bound.",
        "",
        "| workers | policy | slowdown | p99 bound (s) | measured knee (req/s) | simulated"
        " | sim / measured | overhead, router hop (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r["simulated_knee_rps"] / r["measured_knee_rps"] if r["measured_knee_rps"] else 0
        lines.append(
            f"| {r['workers']} | {r['policy']} | {r['curve']['label'].split('slowed ')[-1]} | "
            f"{r['p99_bound_s']:g} | "
            f"{r['measured_knee_rps']:.1f} | {r['simulated_knee_rps']:.1f} | {ratio:.2f} | "
            f"{r['overhead_s'] * 1e3:.1f}, {r['router_hop_s'] * 1e3:.1f} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}.md")
    subprocess.run(["cat", str(out.with_suffix(".md"))], check=False)
