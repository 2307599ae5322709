"""Cutting one request's inputs into work items, shared by the JSON and native routes.

A request becomes several items so several workers can share it; items stay well under
NATS's message limit both ways (texts in, vectors out).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["RESULT_BYTES_PER_ITEM", "split_points"]

RESULT_BYTES_PER_ITEM = 768 * 1024
"""Most vector bytes one item's reply may carry (NATS's default max payload is 1 MiB)."""


def split_points(
    sizes: Sequence[int], max_items: int, max_bytes: int, row_bytes: int
) -> list[tuple[int, int]]:
    """`(start, stop)` ranges over the inputs: each range has at most `max_items` inputs,
    at most `max_bytes` of input (one oversized input travels alone), and a reply of at
    most `RESULT_BYTES_PER_ITEM` at `row_bytes` per vector."""
    max_items = max(1, min(max_items, RESULT_BYTES_PER_ITEM // max(row_bytes, 1)))
    ranges: list[tuple[int, int]] = []
    start = 0
    used = 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= max_items or used + size > max_bytes):
            ranges.append((start, i))
            start, used = i, 0
        used += size
    if sizes:
        ranges.append((start, len(sizes)))
    return ranges
