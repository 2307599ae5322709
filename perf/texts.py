"""The fixed, seeded text sets every benchmark uses, shipped in perf/data.

    .venv/bin/python -m perf texts     # (re)write perf/data/{short,passages}.jsonl

The sets are `shoal.tune.texts` (what `shoal tune` measures with), written to files so a
benchmark's input can be read without Shoal: short queries of about 10-30 tokens,
passages of about 200-500. `mixed` is not a file: it interleaves the two, seeded too.
"""

from __future__ import annotations

import json
from pathlib import Path

from shoal.tune.texts import SETS, generate

DATA = Path(__file__).resolve().parent / "data"


def write_sets() -> None:
    DATA.mkdir(exist_ok=True)
    for name in SETS:
        with (DATA / f"{name}.jsonl").open("w") as out:
            for text in generate(name):
                out.write(json.dumps({"text": text}) + "\n")


def load(name: str) -> list[str]:
    """A text set by name: `short`, `passages` or `mixed`."""
    if name == "mixed":
        return generate("mixed")
    with (DATA / f"{name}.jsonl").open() as lines:
        return [json.loads(line)["text"] for line in lines]
