"""Timing headers on inference responses (as TEI sends them)."""

from __future__ import annotations

from ...compat.embed import Vectors

__all__ = ["timing_headers"]


def timing_headers(vectors: Vectors) -> dict[str, str]:
    return {
        "x-queue-time": f"{vectors.queue_ms:.2f}",
        "x-inference-time": f"{vectors.inference_ms:.2f}",
    }
