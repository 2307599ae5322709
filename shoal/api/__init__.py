"""The HTTP gateway: OpenAI JSON routes, native msgpack routes, health, errors."""

from .app import create_app

__all__ = ["create_app"]
