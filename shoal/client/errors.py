"""Typed errors for what the server answered: each carries its status, OpenAI-style
error code and message, so callers branch on a class or a code, never on text."""

from __future__ import annotations

import httpx

__all__ = [
    "BadRequestError",
    "NativeError",
    "NotFoundError",
    "PayloadTooLargeError",
    "RateLimitError",
    "ServerError",
    "ShoalAPIError",
    "TimeoutError",
    "UnavailableError",
    "error_from_response",
]


class ShoalAPIError(Exception):
    """The server refused the request or failed it."""

    def __init__(
        self,
        status: int,
        code: str | None,
        message: str,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.retry_after = retry_after
        """Seconds the server asked to wait before trying again (429 and 503)."""


NativeError = ShoalAPIError
"""The name of the base class before the typed ones existed."""


class BadRequestError(ShoalAPIError):
    """400: the request itself is wrong (empty input, too long with truncate off, ...)."""


class NotFoundError(ShoalAPIError):
    """404: unknown model or adapter."""


class PayloadTooLargeError(ShoalAPIError):
    """413: the body or the number of inputs is over the server's limit."""


class RateLimitError(ShoalAPIError):
    """429: the queue is full; retried by the client unless its retries ran out."""


class ServerError(ShoalAPIError):
    """5xx other than 503 and 504."""


class UnavailableError(ServerError):
    """503: no worker serves the model, or NATS is unreachable; retried by the client."""


class TimeoutError(ServerError):
    """504: not answered before the request's deadline."""


_BY_STATUS: dict[int, type[ShoalAPIError]] = {
    400: BadRequestError,
    404: NotFoundError,
    413: PayloadTooLargeError,
    429: RateLimitError,
    503: UnavailableError,
    504: TimeoutError,
}


def error_from_response(response: httpx.Response) -> ShoalAPIError:
    status = response.status_code
    kind = _BY_STATUS.get(status, ServerError if status >= 500 else ShoalAPIError)
    retry_after = _retry_after(response.headers.get("retry-after"))
    try:
        error = response.json()["error"]
        return kind(
            status,
            error.get("code"),
            error.get("message", ""),
            error.get("param"),
            retry_after,
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return kind(status, None, response.text[:200], None, retry_after)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: Shoal never sends one; fall back to backoff
