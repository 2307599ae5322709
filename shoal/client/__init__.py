"""Native msgpack client for bulk work."""

from .native import NativeError, embed

__all__ = ["NativeError", "embed"]
