"""What `shoal tune` shows and keeps once it is done: the table of candidates with the
winner's gain, a JSON report and a PNG plot, and the winner written into the user's model
spec. The live lines while it runs are progress.py's."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from ..model_registry import BatchProfile, ModelRegistry, ModelSpec
from .knee import Knee
from .machine import machine
from .runner import TuneResult
from .search import Trial

__all__ = ["print_table", "write_profile", "write_report"]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _knee(trial: Trial) -> Knee | None:
    """The trial's measurement; a failed trial holds the exception instead."""
    return trial.detail if isinstance(trial.detail, Knee) else None


def print_table(result: TuneResult, console: Console) -> None:
    table = Table(title=f"shoal tune {result.model}: {len(result.trials)} candidates")
    knobs = list(result.default)
    for column in ("#", "phase", *knobs, f"{result.unit}/s", "p50 ms", "p99 ms"):
        table.add_column(column, justify="right")
    for i, trial in enumerate(result.trials):
        knee = _knee(trial)
        style = "bold green" if trial.candidate == result.winner else ""
        table.add_row(
            str(i),
            trial.phase,
            *(str(trial.candidate[k]) for k in knobs),
            f"{trial.score:.1f}",
            _ms(knee.knee_p50_ms if knee else None),
            _ms(knee.knee_p99_ms if knee else None),
            style=style,
        )
    console.print(table)
    console.print(
        f"winner (mean of its runs): {result.score(result.winner):.1f} {result.unit}/s, "
        f"{result.gain:.2f}x the default's {result.score(result.default):.1f} "
        f"(in {result.elapsed_s:.0f}s)"
    )


def write_report(result: TuneResult, out_dir: Path, workload: str) -> tuple[Path, Path | None]:
    """`<model>-<time>.json` and, with matplotlib installed, `.png`, in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"tune-{result.model.replace('/', '_')}-{time.strftime('%Y%m%d-%H%M%S')}"
    report: dict[str, Any] = {
        "model": result.model,
        "workload": workload,
        "unit": result.unit,
        "machine": machine(),
        "elapsed_s": result.elapsed_s,
        "search_budget_s": result.search_budget_s,
        "profile": msgspec.to_builtins(result.profile),
        "score": result.score(result.winner),
        "default_score": result.score(result.default),
        "gain_over_default": result.gain,
        "cosine_to_float32": result.quality,
        "trials": [
            {
                "candidate": t.candidate,
                "phase": t.phase,
                "score": t.score,
                "seconds": t.seconds,
                "knee": asdict(knee) if (knee := _knee(t)) else None,
                "error": None if knee else repr(t.detail),
                "winner": t.candidate == result.winner,
            }
            for t in result.trials
        ],
    }
    json_path = stem.with_suffix(".json")
    json_path.write_text(json.dumps(report, indent=2))
    return json_path, _plot(result, stem.with_suffix(".png"))


def _plot(result: TuneResult, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    labelled: set[str] = set()
    for i, trial in enumerate(result.trials):
        knee = _knee(trial)
        if knee is None or not knee.steps:
            continue
        steps = [s for s in knee.steps if s.p99_ms is not None]
        winner = trial.candidate == result.winner
        special = winner or i == 0
        ax.plot(
            [s.achieved_tps for s in steps],
            [s.p99_ms for s in steps],
            marker="o",
            linewidth=2.5 if special else 0.8,
            alpha=1.0 if special else 0.5,
            label=_label(trial, i, result, labelled),
        )
    ax.set_xlabel(f"achieved throughput ({result.unit}/s)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_yscale("log")
    ax.set_title(f"shoal tune {result.model}: one line per candidate profile")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _label(trial: Trial, i: int, result: TuneResult, labelled: set[str]) -> str | None:
    """'default' and 'winner' once each (a candidate measured again has several lines)."""
    name = "winner" if trial.candidate == result.winner else ("default" if i == 0 else "")
    if not name or name in labelled:
        return None
    labelled.add(name)
    return name


def write_profile(spec_path: Path, spec: ModelSpec, profile: BatchProfile, note: str) -> None:
    """Set `spec`'s profile in the user's spec file at `spec_path` (made if missing): the
    model's entry there is updated in place, comments kept; a model the file lacks (a
    built-in) gets an entry copied from `spec`, since an entry replaces a built-in whole.

    Raises:
        ValueError: the file is not a valid spec, before or after the change.
    """
    import tomlkit

    document = tomlkit.parse(spec_path.read_text()) if spec_path.exists() else tomlkit.document()
    if not document.get("models"):  # absent, or `models = []`: tables need an array of tables
        document.pop("models", None)
        document.append("models", tomlkit.aot())
    models = document["models"]
    entry = next((m for m in models if m.get("id") == spec.id), None)
    if entry is None:
        entry = tomlkit.table()
        for key, value in msgspec.to_builtins(spec).items():
            if key != "profile" and value not in ([], {}, "", None):
                entry[key] = value
        models.append(entry)
    table = tomlkit.table()
    table.add(tomlkit.comment(note))
    for key, value in msgspec.to_builtins(profile).items():
        table[key] = value
    entry["profile"] = table
    text = tomlkit.dumps(document)
    tmp = spec_path.with_suffix(spec_path.suffix + ".tmp")
    tmp.write_text(text)
    ModelRegistry.from_files(tmp).resolve(spec.id)  # raises ValueError if we broke it
    tmp.replace(spec_path)
