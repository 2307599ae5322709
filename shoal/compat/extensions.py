"""The `shoal` object a request body may carry, for what an OpenAI client cannot say in
the model string."""

from __future__ import annotations

import msgspec

__all__ = ["ShoalOptions"]


class ShoalOptions(msgspec.Struct, kw_only=True):
    adapter: str | None = None
    """A LoRA adapter of the model, as `model="base:adapter"` would name it."""
