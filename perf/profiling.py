"""Where the time goes: py-spy profiles of the gateway and the worker under a fixed load.
(Not named profile.py: run as a script, a perf/ script would import it as the standard
library's `profile`, which cProfile, and so torch, import.)

    .venv/bin/python -m perf profile [--workload embed-short] [--load 0.9] [--seconds 15]
        [--profile dtype=bfloat16,...]

Starts Shoal as in `perf knee` (nats-server, one encoder worker, the gateway on
loopback), probes its capacity (closed loop), then offers `--load` times that capacity
open loop for `--seconds` while `py-spy record --nonblocking` samples both processes (all
threads). Results: perf/results/profile-<workload>-<time>.md (per process: how busy each
thread was, the heaviest functions by own and by inclusive time) and the collapsed stacks
beside it (`.gateway.txt`, `.worker.txt`, for any flame graph viewer). Needs the `perf`
extra (py-spy). Native threads (torch's OpenMP pool) are not Python threads: their work
shows in the Python frame that called into torch.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.embed_throughput import machine  # noqa: E402
from perf.knee import _profile_arg, shoal_stack, workload_load  # noqa: E402
from perf.workloads import WORKLOADS  # noqa: E402
from shoal.tune.knee import Load, describe  # noqa: E402

RATE_HZ = 100
"""py-spy samples per second per thread."""


@dataclass
class Profile:
    """Collapsed stacks of one process: `thread;frame;frame ... count` lines."""

    threads: collections.Counter = field(default_factory=collections.Counter)
    own: collections.Counter = field(default_factory=collections.Counter)
    inclusive: collections.Counter = field(default_factory=collections.Counter)

    @classmethod
    def read(cls, path: Path) -> Profile:
        profile = cls()
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack:
                continue
            n = int(count)
            thread, *frames = stack.split(";")
            profile.threads[_thread_name(thread)] += n
            if frames:
                profile.own[frames[-1]] += n
            for name in {_function(f) for f in frames}:
                profile.inclusive[name] += n
        return profile

    @property
    def samples(self) -> int:
        return sum(self.threads.values())


def _thread_name(frame: str) -> str:
    # py-spy writes `thread (TID): NAME`; numbered pool threads merge by name.
    return frame.rsplit(": ", 1)[-1] if ": " in frame else frame


def _function(frame: str) -> str:
    """`fn (file.py:12)` -> `fn (file.py)`: one entry per function, not per line."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def summarize(name: str, profile: Profile, seconds: float, top: int = 15) -> list[str]:
    wall = RATE_HZ * seconds
    lines = [f"## {name}: {profile.samples} samples", "", "| thread | busy (share of wall) |"]
    lines += ["|---|---|"]
    lines += [f"| {t} | {n / wall:.0%} |" for t, n in profile.threads.most_common()]
    lines += ["", "| own time | function |", "|---|---|"]
    total = max(1, profile.samples)
    lines += [f"| {n / total:.1%} | `{f}` |" for f, n in profile.own.most_common(top)]
    lines += ["", "| inclusive | function |", "|---|---|"]
    shoal = [(f, n) for f, n in profile.inclusive.most_common() if "shoal/" in f or "litestar" in f]
    lines += [f"| {n / total:.1%} | `{f}` |" for f, n in shoal[: 2 * top]]
    return [*lines, ""]


def _record(pids: dict[str, int], seconds: float, out: Path) -> list[subprocess.Popen]:
    """A py-spy per process, sampling for `seconds` beside the load."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    options = ["--duration", str(int(seconds)), "--rate", str(RATE_HZ), "--format", "raw"]
    options += ["--threads", "--nonblocking"]
    return [
        subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(pid),
                *options,
                "--output",
                str(out.with_suffix(f".{role}.txt")),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for role, pid in pids.items()
    ]


async def _drive(
    load_: Load, fraction: float, seconds: float, pids: dict[str, int], out: Path,
    rate: float | None = None,
):  # fmt: skip
    async with load_.client() as client:
        await load_.probe(client, 3.0, 8)  # warm up
        capacity = await load_.probe(client, 5.0, 16)
        recorders = _record(pids, seconds, out)
        step = await load_.step(client, rate or fraction * capacity, seconds)
    for recorder in recorders:
        recorder.wait(seconds + 30)
    return capacity, step


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m perf profile", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="embed-short")
    parser.add_argument("--load", type=float, default=0.9, help="share of probed capacity")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rate", type=float, help="requests/s, instead of a share of capacity")
    parser.add_argument("--tree", help="profile Shoal from this other checkout (before/after)")
    parser.add_argument("--profile", type=_profile_arg, default={})
    parser.add_argument("--out", default=str(ROOT / "perf" / "results"))
    args = parser.parse_args(argv)
    workload = WORKLOADS[args.workload]()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) / f"profile-{workload.name}-{stamp}"
    out.parent.mkdir(parents=True, exist_ok=True)
    tree = Path(args.tree) if args.tree else None
    with shoal_stack(args.profile, workload, tree) as stack:
        load_ = workload_load(stack.base, workload)
        capacity, step = asyncio.run(
            _drive(load_, args.load, args.seconds, stack.pids, out, args.rate)
        )
    info = machine()
    lines = [
        f"# Profile: {args.workload}",
        "",
        f"`python -m perf profile {' '.join(argv)}` on {info['cpu']} ({info['cores']} cores), "
        f"torch {info['torch']}; profile overrides {args.profile or 'none'}.",
        "",
        f"Probed capacity {capacity:.1f} requests/s; during the profile: "
        f"{describe(step, workload.unit)}. py-spy at {RATE_HZ} Hz, non-blocking, on both "
        "processes (its own CPU shares the cores).",
        "",
    ]
    for role in stack.pids:
        path = out.with_suffix(f".{role}.txt")
        if path.exists():
            lines += summarize(role, Profile.read(path), args.seconds)
        else:
            lines += [f"## {role}: py-spy wrote nothing (is ptrace allowed here?)", ""]
    out.with_suffix(".md").write_text("\n".join(lines))
    print(out.with_suffix(".md").read_text())
