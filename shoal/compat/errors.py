"""Shoal's error hierarchy and OpenAI's error envelope.

Each error class carries its HTTP status, OpenAI error `type` and `code`, so one handler
(shoal/api/errors.py) renders every failure the same way:
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

__all__ = [
    "BadGatewayError",
    "ConflictError",
    "ErrorBody",
    "ErrorResponse",
    "GatewayTimeoutError",
    "InternalError",
    "InvalidRequestError",
    "ModelNotFoundError",
    "NotFoundError",
    "OverloadedError",
    "PayloadTooLargeError",
    "ShoalError",
    "UnavailableError",
    "UnsupportedMediaTypeError",
    "error_response",
]


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(msgspec.Struct):
    """https://platform.openai.com/docs/guides/error-codes"""

    error: ErrorBody


class ShoalError(Exception):
    """Every error a client sees: an HTTP status and OpenAI's error envelope."""

    status_code: int = 500
    openai_type: str = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.retry_after = retry_after

    def to_response(self) -> ErrorResponse:
        return error_response(self.message, self.openai_type, self.param, self.code)


class InvalidRequestError(ShoalError):
    status_code = 400
    openai_type = "invalid_request_error"


class NotFoundError(ShoalError):
    status_code = 404
    openai_type = "invalid_request_error"
    code = "not_found"


class ModelNotFoundError(NotFoundError):
    code = "model_not_found"

    def __init__(self, model: str, served: Sequence[str] = ()) -> None:
        """`served`: models the caller could name instead (the first few are listed)."""
        message = f"The model '{model}' does not exist"
        if served:
            shown = ", ".join(f"'{name}'" for name in served[:_LISTED])
            more = f" and {len(served) - _LISTED} more" if len(served) > _LISTED else ""
            message += f"; served: {shown}{more} (GET /v1/models lists them)"
        super().__init__(message, param="model")


_LISTED = 5


class ConflictError(ShoalError):
    status_code = 409
    openai_type = "invalid_request_error"
    code = "conflict"


class PayloadTooLargeError(ShoalError):
    status_code = 413
    openai_type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedMediaTypeError(ShoalError):
    status_code = 415
    openai_type = "invalid_request_error"
    code = "unsupported_media_type"


class OverloadedError(ShoalError):
    """429: try again after `retry_after` seconds."""

    status_code = 429
    openai_type = "rate_limit_error"
    code = "queue_full"


class UnavailableError(ShoalError):
    status_code = 503
    openai_type = "server_error"
    code = "unavailable"


class GatewayTimeoutError(ShoalError):
    status_code = 504
    openai_type = "server_error"
    code = "timeout"


class BadGatewayError(ShoalError):
    status_code = 502
    openai_type = "server_error"
    code = "worker_error"


class InternalError(ShoalError):
    status_code = 500
    openai_type = "server_error"
    code = "internal_error"


def error_response(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> ErrorResponse:
    return ErrorResponse(ErrorBody(message=message, type=type_, param=param, code=code))
