"""How batch composition changes the model's own throughput (no queue, no HTTP).

    .venv/bin/python perf/batch_padding.py [--texts 2000] [--batch 64]

The same seeded short texts, embedded by Shoal's sentence-transformers adapter in batches
of `batch` made three ways: FIFO rounds sorted within each round (what a naive batcher
does), the whole set sorted by length (the best case, what `encode` does on a list), and
Shoal's batcher (the oldest pending input plus those nearest it in length) drawing from a
pool of 2, 4 and 8 batches refilled in arrival order. Reports texts/s and padding
efficiency (real tokens / padded tokens), median of interleaved rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.embed_throughput import short_texts  # noqa: E402
from shoal.model_registry import BatchProfile, ModelRegistry  # noqa: E402
from shoal.workers.adapters import make_adapter  # noqa: E402
from shoal.workers.batcher import Batcher  # noqa: E402


class _Unit:
    def __init__(self, tok) -> None:
        self.tok = tok
        self.cost = len(tok.ids)


def fifo_rounds(toks: list, batch: int) -> list[list]:
    return [
        sorted(toks[i : i + batch], key=lambda t: len(t.ids)) for i in range(0, len(toks), batch)
    ]


def sorted_all(toks: list, batch: int) -> list[list]:
    ordered = sorted(toks, key=lambda t: len(t.ids))
    return [ordered[i : i + batch] for i in range(0, len(ordered), batch)]


def shoal_batcher(toks: list, batch: int, pool_batches: int) -> list[list]:
    profile = BatchProfile(max_batch_tokens=1 << 20, max_batch_items=batch, max_wait_ms=0)
    batcher: Batcher[_Unit] = Batcher(profile, time.monotonic)
    pending = [_Unit(t) for t in toks]
    out = []
    while pending or len(batcher):
        room = pool_batches * batch - len(batcher)
        batcher.add(pending[:room])
        pending = pending[room:]
        out.append([u.tok for u in batcher.take()])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spec = ModelRegistry.from_files().resolve("all-MiniLM-L6-v2")
    adapter = make_adapter(spec, "cpu")
    adapter.load()
    adapter.warmup()
    toks = adapter.tokenize(short_texts(args.texts))
    plans = {
        "FIFO rounds, sorted within": fifo_rounds(toks, args.batch),
        "all sorted by length (best case)": sorted_all(toks, args.batch),
        **{
            f"Shoal batcher, pool of {k} batches": shoal_batcher(toks, args.batch, k)
            for k in (2, 4, 8)
        },
    }
    speed: dict[str, list[float]] = {name: [] for name in plans}
    for _ in range(args.rounds):
        for name, batches in plans.items():
            started = time.perf_counter()
            for b in batches:
                adapter.embed(b)
            speed[name].append(len(toks) / (time.perf_counter() - started))
    best = statistics.median(speed["all sorted by length (best case)"])
    print("| batches | texts/s (median) | vs best case | padding efficiency |")
    print("|---|---|---|---|")
    for name, batches in plans.items():
        real = sum(len(t.ids) for b in batches for t in b)
        padded = sum(len(b) * max(len(t.ids) for t in b) for b in batches)
        median = statistics.median(speed[name])
        print(f"| {name} | {median:.1f} | {median / best:.2f} | {real / padded:.2f} |")


if __name__ == "__main__":
    main()
