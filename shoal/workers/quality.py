"""The quality guard for faster precisions: how close a profile's outputs stay to float32.

A profile may serve a model in bf16, or through another engine, only if its vectors stay
close to the float32 ones: `cosine_vs_float32` runs the same texts through the model in
both precisions, through the same adapter code the worker runs, and returns the worst and
the mean cosine similarity of the outputs (embed vectors, or classification logits).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np

from ..model_registry import ModelSpec
from ..queue.messages import EmbedJob
from .adapters import EncoderAdapter, make_adapter
from .adapters._guard import QUALITY_FLOOR, row_cosines

__all__ = ["QUALITY_FLOOR", "cosine_to", "cosine_vs_float32", "embed", "float32_vectors"]


def embed(adapter: EncoderAdapter, texts: Sequence[str], batch: int = 64) -> np.ndarray:
    """`texts` through `adapter`'s embed forward, `batch` rows at a time, length-sorted the
    way the worker batches them; rows back in input order."""
    job = EmbedJob(
        request_id="quality",
        part=0,
        model=adapter.spec.id,
        reply_to="",
        deadline=0,
        texts=list(texts),
    )
    rows = adapter.units(job)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].ids))
    out = np.empty((len(rows), adapter.dims), dtype=np.float32)
    for start in range(0, len(order), batch):
        chunk = order[start : start + batch]
        out[chunk] = np.stack(list(adapter.forward("embed", [rows[i] for i in chunk])))
    return out


def float32_vectors(
    spec: ModelSpec, path: str, texts: Sequence[str], device: str = "cpu"
) -> np.ndarray:
    """`texts` through `spec` in float32 torch: what every faster profile is held to."""
    float32 = msgspec.structs.replace(spec.profile, dtype="float32", engine="torch")
    exact = make_adapter(msgspec.structs.replace(spec, profile=float32), device)
    exact.load(path)
    return embed(exact, texts)


def cosine_to(
    reference: np.ndarray,
    spec: ModelSpec,
    path: str,
    texts: Sequence[str],
    device: str = "cpu",
    cache_dir: Path | None = None,
) -> tuple[float, float]:
    """(worst, mean) cosine between `spec`'s profile on `texts` and `reference` (their
    `float32_vectors`). `cache_dir`: where the engine finds a graph a worker converted
    (`make_adapter`), so a check does not convert it again."""
    fast = make_adapter(spec, device, cache_dir=cache_dir)
    fast.load(path)
    cos = row_cosines(reference, embed(fast, texts))
    return float(cos.min()), float(cos.mean())


def cosine_vs_float32(
    spec: ModelSpec,
    path: str,
    texts: Sequence[str],
    device: str = "cpu",
    cache_dir: Path | None = None,
) -> tuple[float, float]:
    """(worst, mean) cosine between `spec`'s profile and float32 torch on `texts`."""
    reference = float32_vectors(spec, path, texts, device)
    return cosine_to(reference, spec, path, texts, device, cache_dir)
