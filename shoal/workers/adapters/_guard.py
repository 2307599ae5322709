"""How close another engine's or precision's outputs stay to float32 torch.

`worst_cosine` is the one measure: per output row (an embedding, a row of logits, a
window's token logits flattened) the cosine similarity, and for one-number rows (a
reranker's score) the cosine of the whole column, so a score that drifts still counts.
`PROBE_TEXTS` are what the `auto` engine checks at load: short and long, so the probe
pads, and one long enough to reach a model's length limit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["EXACT_FLOOR", "PROBE_TEXTS", "QUALITY_FLOOR", "row_cosines", "worst_cosine"]

QUALITY_FLOOR = 0.99
"""Least cosine similarity to float32 a faster precision must keep on every text."""

EXACT_FLOOR = 0.99999
"""Least cosine to float32 torch for an engine that serves float32 by default: only
summation order may differ (measured on MiniLM and its task heads: 0.9999999+)."""

PROBE_TEXTS = (
    "Hello.",
    "Where do salmon spawn?",
    "The quick brown fox jumps over the lazy dog.",
    "Résumé: naïve café owners in Zürich sell crème brûlée for 4.50 CHF.",
    "def add(a, b):\n    return a + b  # numbers, code and symbols {}[]<>",
    "Salmon return from the ocean to the river where they hatched, swim upstream against "
    "the current, and lay their eggs in gravel beds, after which most of them die.",
    "东京是日本的首都。 Москва — столица России. القاهرة عاصمة مصر.",
    " ".join(["A long passage that repeats until it reaches the model's length limit."] * 60),
)


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of `a` to the same row of `b` (rows flattened); a
    single column is compared whole, as one vector."""
    a = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    b = np.asarray(b, dtype=np.float64).reshape(len(b), -1)
    if a.shape[1] == 1:
        a, b = a.T, b.T
    dot = (a * b).sum(1)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    # A zero row has no direction: it agrees only with the same row.
    zero = norms == 0
    equal = np.all(np.isclose(a, b), axis=1)
    return np.where(zero, equal.astype(np.float64), dot / np.where(zero, 1.0, norms))


def worst_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(row_cosines(a, b).min())
