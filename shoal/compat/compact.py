"""Compact vectors: what large indexes store instead of float32.

- `int8` / `uint8`: each component bucketed into 256 steps between the model's
  calibration range for that component (below: clipped to the first step, above: to the
  last), as sentence-transformers' `quantize_embeddings` does with the same `ranges`;
- `binary` / `ubinary`: one bit per component (1 where it is > 0), packed 8 a byte, the
  first component in the top bit (numpy's `packbits`); `binary` is the byte - 128 as
  int8, as Cohere's API sends it.

The calibration range of a model is the per-component min and max of its vectors of
`calibration_texts()`, a fixed set of English sentences (CPython's own documentation,
which every Python ships): the gateway embeds them once per model and dimension count
(`shoal.api.calibration`).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Literal, get_args

import numpy as np

__all__ = [
    "CALIBRATION_TEXTS",
    "COMPACT_TYPES",
    "CompactType",
    "calibration_texts",
    "quantize",
    "ranges_dims",
    "ranges_of",
    "unit_rows",
]

CompactType = Literal["int8", "uint8", "binary", "ubinary"]
COMPACT_TYPES: tuple[str, ...] = get_args(CompactType)
CALIBRATION_TEXTS = 512


def _needs_ranges(types: list[str] | tuple[str, ...] | str) -> bool:
    """Whether any of `types` buckets by the model's calibration range."""
    types = [types] if isinstance(types, str) else types
    return any(t in ("int8", "uint8") for t in types)


def ranges_dims(types: list[str] | str, dimensions: int | None, spec_dims: int) -> int | None:
    """The dimension count whose calibration range an answer of `types` needs (the
    request's `dimensions`, else the model's), or None when none of them buckets."""
    return (dimensions or spec_dims) if _needs_ranges(types) else None


def unit_rows(rows: np.ndarray) -> np.ndarray:
    """`rows` scaled to length 1 (a zero row stays zero)."""
    return rows / np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), 1e-12)


def quantize(vectors: np.ndarray, kind: CompactType, ranges: np.ndarray | None) -> np.ndarray:
    """`vectors` (rows, dims, float32) as `kind`: (rows, dims) int8/uint8, or (rows,
    ceil(dims / 8)) packed bits. `ranges` (2, dims: min, max) is needed by int8/uint8."""
    if kind in ("binary", "ubinary"):
        packed = np.packbits(vectors > 0, axis=-1)
        return (packed.astype(np.int16) - 128).astype(np.int8) if kind == "binary" else packed
    if ranges is None:
        raise ValueError(f"{kind} needs the model's calibration ranges")
    starts = ranges[0].astype(np.float32)
    steps = (ranges[1].astype(np.float32) - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    buckets = np.clip(np.floor((vectors - starts) / steps), 0, 255)
    return (buckets - 128).astype(np.int8) if kind == "int8" else buckets.astype(np.uint8)


def ranges_of(calibration: np.ndarray, dims: int, normalize: bool) -> np.ndarray:
    """(2, dims) per-component min and max of the calibration vectors cut to `dims`
    components, re-normalized where the model normalizes (as the worker cuts them)."""
    cut = calibration[:, :dims]
    if normalize and dims < calibration.shape[1]:
        cut = unit_rows(cut)
    return np.vstack((cut.min(axis=0), cut.max(axis=0))).astype(np.float32)


@cache
def calibration_texts() -> tuple[str, ...]:
    """`CALIBRATION_TEXTS` English sentences of 40-300 characters from CPython's
    documentation (`pydoc_data.topics`), prose only (no code), in a fixed order."""
    from pydoc_data.topics import topics

    prose = []
    for topic in sorted(topics):
        for sentence in re.split(r"(?<=[.!?])\s+", topics[topic]):
            sentence = " ".join(sentence.split())
            if 40 <= len(sentence) <= 300 and sentence[0].isupper() and not _CODE.search(sentence):
                prose.append(sentence)
    prose = list(dict.fromkeys(prose))  # topics repeat some sentences
    step = max(1, len(prose) // CALIBRATION_TEXTS)
    return tuple(prose[::step][:CALIBRATION_TEXTS])


_CODE = re.compile(r"[{}\[\]()=<>_*`|\\]")
