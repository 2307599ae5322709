"""Native msgpack client for bulk work: `Client`, `AsyncClient`, and `embed` for one call."""

from .calls import RetryPolicy
from .clients import AsyncClient, Client
from .errors import (
    BadRequestError,
    NativeError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    ServerError,
    ShoalAPIError,
    TimeoutError,
    UnavailableError,
)
from .native import embed

__all__ = [
    "AsyncClient",
    "BadRequestError",
    "Client",
    "NativeError",
    "NotFoundError",
    "PayloadTooLargeError",
    "RateLimitError",
    "RetryPolicy",
    "ServerError",
    "ShoalAPIError",
    "TimeoutError",
    "UnavailableError",
    "embed",
]
