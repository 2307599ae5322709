"""Pull against push routers at cluster scale, by simulation (sim.py), calibrated on what
`python -m perf scale calibrate` measured here.

    .venv/bin/python -m perf scale simulate [--workers 8,32,128] [--models 1,20,50]
        [--curves cpu,gpu] [--seconds 10]

Per curve, worker count and model count: each policy's knee (requests/s of the best
step that answered 90% with p99 within the bound), the devices' utilization and the
latency at that step, and each policy's knee against the best push router's. `pull` is
Shoal as it ships (the pull horizon); `pull-anytime` is Shoal's pull before it (a busy
worker keeps a pull waiting).

Curves: `cpu` is the forward curve measured here (MiniLM, Shoal's adapter, this CPU);
`gpu` is assumed, not measured as a curve: a fixed 5 ms a pass (assumed) plus the
per-token cost of the 131.8k tokens/s that one H200 served MiniLM at through Shoal
(perf/results/gpu-h200-20261204). Results: perf/results/scale-simulate-<time>.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from perf.scale.sim import Curve, QueueCosts, Scenario, find_knee  # noqa: E402
from shoal.workers.encoder.schedule import PULL_HORIZON  # noqa: E402

GPU_TOKENS_PER_S = 131785.3
"""MiniLM through gateway + NATS + one CUDA worker on an H200 (knee, 2026-12-04)."""
GPU_BASE_S = 0.005
"""Assumed: a pass's fixed cost on a GPU (launches, copies); not measured."""
ROUTER_S = 0.00005
"""Assumed: a push router's cost per request (a compiled router; the Python one in
perf/scale/router.py costs more). One router serves the whole cluster."""
PUSH = ("round-robin", "least-outstanding", "power-of-two", "hash")
VARIANTS = {"pull": PULL_HORIZON, "pull-anytime": None}


def curves(calibration: dict) -> dict[str, Curve]:
    return {
        "cpu": Curve.calibrated(calibration, "MiniLM, this CPU (measured)"),
        "gpu": Curve(GPU_BASE_S, 0.0, 1 / GPU_TOKENS_PER_S, "MiniLM, H200 (assumed curve)"),
    }


def run(scenario: Scenario, policy: str, args: argparse.Namespace) -> dict:
    name = policy
    if policy in VARIANTS:
        scenario = replace(scenario, pull_horizon_s=VARIANTS[policy])
        policy = "pull"
    started = time.perf_counter()
    knee, step = find_knee(scenario, policy, args.p99_bound, args.seconds)
    row = {"policy": name, "knee_rps": knee, "seconds": time.perf_counter() - started}
    if step is not None:
        row |= {
            "utilization": step.utilization,
            "mean_batch_rows": step.mean_batch_rows,
            "p50_ms": step.step.p50_ms,
            "p99_ms": step.step.p99_ms,
        }
    return row


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf scale simulate")
    parser.add_argument("--workers", default="8,32,128")
    parser.add_argument("--models", default="1,20,50")
    parser.add_argument("--curves", default="cpu,gpu")
    parser.add_argument("--policies", default=",".join([*VARIANTS, *PUSH]))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--p99-bound", type=float, default=1.0)
    parser.add_argument(
        "--calibration", type=Path, default=ROOT / "perf/results/scale-calibration-cpu.json"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "perf/results")
    args = parser.parse_args(argv)
    calibration = json.loads(args.calibration.read_text())
    queue = QueueCosts.calibrated(calibration)
    lengths = calibration["token_lengths"]
    rows = []
    for curve_name in args.curves.split(","):
        curve = curves(calibration)[curve_name]
        for workers in (int(w) for w in args.workers.split(",")):
            for models in (int(m) for m in args.models.split(",")):
                scenario = Scenario(
                    workers=workers,
                    models=models,
                    curve=curve,
                    short_lengths=lengths["short"],
                    passage_lengths=lengths["passages"],
                    queue=queue,
                    router_s=ROUTER_S,
                )
                cell = [run(scenario, p, args) for p in args.policies.split(",")]
                best_push = max((r["knee_rps"] for r in cell if r["policy"] in PUSH), default=0)
                for r in cell:
                    r |= {"curve": curve_name, "workers": workers, "models": models}
                    r["vs_best_push"] = r["knee_rps"] / best_push if best_push else None
                    print(
                        f"{curve_name} W={workers} M={models} {r['policy']}:"
                        f" {r['knee_rps']:.1f} req/s"
                        f" ({r['vs_best_push'] or 0:.2f}x best push), utilization"
                        f" {r.get('utilization', 0):.2f}, p99 {r.get('p99_ms') or 0:.0f} ms",
                        flush=True,
                    )
                rows += cell
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out / f"scale-simulate-{stamp}"
    curves_used = {n: asdict(c) for n, c in curves(calibration).items()}
    out.with_suffix(".json").write_text(
        json.dumps(
            {"argv": argv, "curves": curves_used, "router_s": ROUTER_S, "rows": rows}, indent=1
        )
    )
    _write_table(out.with_suffix(".md"), argv, rows, args)
    _plot(out.with_suffix(".png"), rows)
    print(f"wrote {out}.md")


def _write_table(path: Path, argv: list[str], rows: list[dict], args: argparse.Namespace) -> None:
    lines = [
        "# Pull against push routers, simulated",
        "",
        f"`python -m perf scale simulate {' '.join(argv)}`: perf/scale/README.md says what is"
        f" measured and what assumed. Knee: requests/s of the best step that answered 90% with"
        f" p99 <= {args.p99_bound} s ({args.seconds:g} simulated seconds a step, Poisson"
        " arrivals, 1-8 texts a request, 20% passages, Zipf 1.1 over the models, 4 models a"
        " worker at most).",
        "",
        "| curve | workers | models | policy | knee (req/s) | vs best push | utilization"
        " | mean batch rows | p50 / p99 (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['vs_best_push']:.2f}" if r["vs_best_push"] else "-"
        latency = f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f}" if r.get("p50_ms") is not None else "-"
        lines.append(
            f"| {r['curve']} | {r['workers']} | {r['models']} | {r['policy']} | "
            f"{r['knee_rps']:.1f} | {ratio} | {r.get('utilization', 0):.2f} | "
            f"{r.get('mean_batch_rows', 0):.1f} | {latency} |"
        )
    path.write_text("\n".join(lines) + "\n")


def _plot(path: Path, rows: list[dict]) -> None:
    """Knee against the best push router, per policy, one panel per curve and model count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["curve"], r["models"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.5), squeeze=False)
    for ax, (curve, models) in zip(axes[0], panels, strict=True):
        cell = [r for r in rows if r["curve"] == curve and r["models"] == models]
        for policy in dict.fromkeys(r["policy"] for r in cell):
            points = sorted(
                (r["workers"], r["vs_best_push"] or 0) for r in cell if r["policy"] == policy
            )
            ax.plot(*zip(*points, strict=True), marker="o", label=policy)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{curve}, {models} model(s)")
        ax.set_xlabel("workers")
        ax.set_ylabel("knee / best push router's")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
