"""Quality against speed for each generation weight tier, both engines: a table and a PNG.

    .venv/bin/python -m perf precision-plot perf/results/precision-points-<date>.json

Measures nothing itself. It joins figures already measured and stored in perf/results:
quality from `perf weight-quality` reports (a tier's top-1 and mean KL against the float32
model of the same checkpoint) or from `llama-perplexity --kl-divergence` summaries, speed
from `perf bakeoff` reports (a target's output tokens/s at each concurrency). The points
file names, for each point, its label, engine, checkpoint and where each figure comes from:

    [{"label": "int8 (Q8_0 blocks)", "engine": "Shoal", "checkpoint": "bf16 stand-in",
      "quality": {"report": "weight-quality-20261207-075721.json", "tier": "int8"},
      "speed": {"report": "bakeoff-20261207-082252.json", "target": "shoal-bf16-int8"}},
     {"label": "float32", ..., "quality": {"reference": true}, ...},
     {"label": "Q4_1 file", "engine": "llama.cpp", ...,
      "quality": {"llama_perplexity": "llamacpp-kl-q4_1-vs-f32-20261207.txt"}, ...}]

Results: perf/results/precision-<time>.{md,png} beside the points file, with every source
named.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

_REFERENCE_KL = 1e-12
"""Where the reference itself (KL 0) is drawn on the log axis."""
_CONCURRENCY = ("1", "32")


def quality(spec: dict, results: Path) -> tuple[float, float]:
    """(top-1, mean KL) of one point."""
    if spec.get("reference"):
        return 1.0, 0.0
    if "llama_perplexity" in spec:
        text = (results / spec["llama_perplexity"]).read_text()
        top1 = re.search(r"Same top p:\s+([0-9.]+)", text)
        kl = re.search(r"Mean\s+KLD:\s+([0-9.eE+-]+)", text)
        if not (top1 and kl):
            raise ValueError(f"{spec['llama_perplexity']}: no KL divergence statistics")
        return float(top1.group(1)) / 100, float(kl.group(1))
    figures = json.loads((results / spec["report"]).read_text())["results"][spec["tier"]]
    return figures["top1"], figures["mean_kl"]


def speed(spec: dict, results: Path) -> dict[str, float]:
    """Output tokens/s of one point at each concurrency the report holds."""
    rounds = json.loads((results / spec["report"]).read_text())["results"][spec["target"]]
    return {c: rounds[c]["tokens_per_s"] for c in _CONCURRENCY if c in rounds}


def joined(points: list[dict], results: Path) -> list[dict]:
    rows = []
    for point in points:
        top1, kl = quality(point["quality"], results)
        rows.append(
            {**point, "top1": top1, "mean_kl": kl, "tokens_per_s": speed(point["speed"], results)}
        )
    return rows


def markdown(rows: list[dict], source: str) -> str:
    lines = [
        f"`python -m perf precision-plot {source}`: quality against speed, each figure from "
        "the report named beside it.",
        "",
        "| engine | checkpoint | tier | top-1 | mean KL (nats) | tokens/s, 1 stream | "
        "tokens/s, 32 streams | sources |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        q = r["quality"]
        named = q.get("report") or q.get("llama_perplexity") or "the reference"
        speeds = [str(r["tokens_per_s"].get(c, "-")) for c in _CONCURRENCY]
        kl = "0 (reference)" if r["mean_kl"] == 0 else f"{r['mean_kl']:.1e}"
        lines.append(
            f"| {r['engine']} | {r['checkpoint']} | {r['label']} | {r['top1']:.4f} | {kl} | "
            f"{' | '.join(speeds)} | {named}; {r['speed']['report']} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(_CONCURRENCY), figsize=(12, 6.5), sharey=True)
    markers = {"Shoal": "o", "llama.cpp": "s"}
    colors = plt.get_cmap("tab10")
    for ax, c in zip(axes, _CONCURRENCY, strict=True):
        for k, r in enumerate(rows):
            if c in r["tokens_per_s"]:
                ax.scatter(
                    r["tokens_per_s"][c], max(r["mean_kl"], _REFERENCE_KL), s=70,
                    marker=markers.get(r["engine"], "^"), color=colors(k % 10),
                    label=f"{r['engine']}: {r['checkpoint']}, {r['label']}",
                )  # fmt: skip
        ax.set_yscale("log")
        ax.set_xlabel(f"output tokens/s, {c} stream{'s' if c != '1' else ''}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel(f"mean KL from float32 (nats; the reference drawn at {_REFERENCE_KL:g})")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8)
    fig.suptitle("Generation tiers: quality against speed (lower right is better)")
    fig.tight_layout(rect=(0, 0.18, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m perf precision-plot POINTS.json")
    points_file = Path(argv[0])
    results = points_file.parent
    rows = joined(json.loads(points_file.read_text()), results)
    stem = results / f"precision-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.with_suffix(".md").write_text(markdown(rows, argv[0]))
    plot(rows, stem.with_suffix(".png"))
    print(stem.with_suffix(".md").read_text())


if __name__ == "__main__":
    main(sys.argv[1:])
