"""`shoal tune MODEL [--workload short|passages|mixed|FILE] [--budget 10m] [--write]`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_tune_command", "parse_budget", "run_tune_command"]


def parse_budget(text: str) -> float:
    """Seconds from `90`, `90s`, `10m` or `1h`."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"'{text}' is not a duration like 90s, 10m or 1h")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def add_tune_command(sub: Any, common: Any) -> None:
    tune = sub.add_parser(
        "tune", help="find a model's best batching profile on this machine (a live search)"
    )
    common(tune)
    tune.add_argument("model", help="model id or alias (an embedding or generation model)")
    tune.add_argument(
        "--workload",
        default="short",
        help="short (queries), passages, mixed, or a file (JSON lines with 'text', or lines)",
    )
    tune.add_argument("--budget", type=parse_budget, default=600.0, help="10m, 90s, 1h (10m)")
    tune.add_argument(
        "--p99-ms", type=float, default=0.0, help="the knee's latency bound (1000; chat 10000)"
    )
    tune.add_argument(
        "--step-seconds",
        type=float,
        default=0.0,
        help="each load step's length (2; chat 10): shorter steps buy more trials, noisier",
    )
    tune.add_argument(
        "--write",
        action="store_true",
        help="save the winner in the model spec file (--spec, else SHOAL_MODELS_FILE) and "
        "make it live for the workers of the NATS server in the settings",
    )
    tune.add_argument(
        "--keep-dtype",
        action="store_true",
        help="search with the model's dtype fixed (vectors stay what they are now)",
    )
    tune.add_argument("--spec", type=Path, help="the model spec file --write updates")
    tune.add_argument("--out", type=Path, help="report directory (default: <data dir>/tune)")


def run_tune_command(args: argparse.Namespace, settings: Any) -> int:
    from rich.console import Console

    from ..model_registry import ModelRegistry, UnknownModelError
    from .progress import Progress
    from .report import print_table, write_profile, write_report
    from .runner import tune

    console = Console(width=None if sys.stdout.isatty() else 160)
    # One log line per request measured would cost the load generator CPU and drown the
    # progress lines (stderr; the report goes to stdout).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    spec_path = args.spec or (Path(settings.models_file) if settings.models_file else None)
    if args.write and spec_path is None:
        print("shoal tune: --write needs --spec FILE or SHOAL_MODELS_FILE", file=sys.stderr)
        return 2
    try:
        spec = ModelRegistry.from_files(*settings.spec_files).resolve(args.model)
        unit = "tokens" if "generate" in spec.tasks else "texts"
        with Progress(args.budget, unit) as progress:
            result = asyncio.run(
                tune(
                    settings,
                    spec.id,
                    workload=args.workload,
                    budget_s=args.budget,
                    p99_ms=args.p99_ms,
                    step_seconds=args.step_seconds,
                    keep_dtype=args.keep_dtype,
                    on_trial=progress.trial,
                    on_phase=progress.phase,
                )
            )
    except (UnknownModelError, ValueError, OSError) as exc:
        print(f"shoal tune: {exc}", file=sys.stderr)
        return 2
    print_table(result, console)
    out = args.out or Path(settings.data_dir) / "tune"
    json_path, png_path = write_report(result, out, args.workload)
    console.print(f"report: {json_path}" + (f", plot: {png_path}" if png_path else ""))
    if args.write:
        from .machine import machine
        from .runner import publish_profile

        m = machine()
        note = (
            f"shoal tune {result.score(result.winner):.1f} {result.unit}/s "
            f"({result.gain:.2f}x default) on "
            f"{m['cpu']}, {m['cores']} cores" + (f", {m['gpu']}" if m["gpu"] else "")
        )
        write_profile(spec_path, spec, result.profile, note)
        console.print(f"profile written to {spec_path}")
        if asyncio.run(publish_profile(settings, spec.id, result.profile)):
            console.print(f"profile live on {settings.nats.display_url}")
        else:
            console.print(f"NATS at {settings.nats.display_url} did not answer: the spec file only")
    return 0
