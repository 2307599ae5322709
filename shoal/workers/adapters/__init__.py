"""Encoder adapters, one module per model family, chosen by the spec's `runtime`."""

from __future__ import annotations

from pathlib import Path

from ...model_registry import ModelSpec
from .base import EncoderAdapter, Tokenized

__all__ = ["EncoderAdapter", "Tokenized", "make_adapter"]


def make_adapter(
    spec: ModelSpec, device: str = "auto", max_loras: int = 8, cache_dir: Path | None = None
) -> EncoderAdapter:
    """The adapter for `spec.runtime`; heavy imports happen only for the one chosen.
    `cache_dir`: where converted engine graphs are kept between processes."""
    if spec.runtime == "dummy":
        from .dummy import DummyAdapter

        return DummyAdapter(spec)
    if spec.runtime == "transformers":
        from .transformers_heads import TransformersHeadAdapter

        return TransformersHeadAdapter(spec, device, max_loras, cache_dir)
    from .sentence_transformers import SentenceTransformerAdapter

    return SentenceTransformerAdapter(spec, device, max_loras, cache_dir)
