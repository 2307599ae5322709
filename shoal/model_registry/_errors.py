"""The one error of model sources, shared by each kind of source."""

from __future__ import annotations

__all__ = ["SourceError"]


class SourceError(ValueError):
    """A source that does not exist, cannot be reached, holds nothing, or is not allowed."""
