"""Encoder adapters, one module per model family, chosen by the spec's `runtime`."""

from __future__ import annotations

from ...model_registry import ModelSpec
from .base import EncoderAdapter, Tokenized

__all__ = ["EncoderAdapter", "Tokenized", "make_adapter"]


def make_adapter(spec: ModelSpec, device: str = "auto", max_loras: int = 8) -> EncoderAdapter:
    """The adapter for `spec.runtime`; heavy imports happen only for the one chosen."""
    if spec.runtime == "dummy":
        from .dummy import DummyAdapter

        return DummyAdapter(spec)
    if spec.runtime == "transformers":
        from .transformers_heads import TransformersHeadAdapter

        return TransformersHeadAdapter(spec, device=device, max_loras=max_loras)
    from .sentence_transformers import SentenceTransformerAdapter

    return SentenceTransformerAdapter(spec, device=device, max_loras=max_loras)
