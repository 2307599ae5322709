"""Every failure, whatever raised it, answered in OpenAI's error envelope.

Registered on the app so that routing errors (404, 405), body-size refusals (413) and
validation errors, which never reach a controller, get the same shape.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import (
    HTTPException,
    InternalServerException,
    SerializationException,
    ValidationException,
)

from ..compat.errors import (
    ErrorResponse,
    GatewayTimeoutError,
    InternalError,
    InvalidRequestError,
    NotFoundError,
    OverloadedError,
    ShoalError,
    UnavailableError,
    error_response,
)
from ..queue import (
    DeadlineExceededError,
    FailureCode,
    JobFailedError,
    NoWorkerError,
    QueueFullError,
    QueueUnavailableError,
)
from ..queue.errors import BacklogTooLongError, PayloadStoreError

__all__ = ["as_shoal_error", "exception_handlers", "send_error"]

log = logging.getLogger(__name__)

_encode = msgspec.json.Encoder().encode
_MISSING_FIELD = re.compile(r"missing required field `([^`]+)`")
_BODY_FIELD = re.compile(r"^(.*) - at `\$\.data\.([^`]+)`$")

_TYPES_BY_STATUS = {
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
    429: ("rate_limit_error", "rate_limited"),
}


def _respond(status: int, body: ErrorResponse, retry_after: float | None = None) -> Response[bytes]:
    headers = {"retry-after": str(max(1, math.ceil(retry_after)))} if retry_after else None
    return Response(
        content=_encode(body), status_code=status, media_type="application/json", headers=headers
    )


def _shoal_error(_: Request, exc: ShoalError) -> Response[bytes]:
    return _respond(exc.status_code, exc.to_response(), exc.retry_after)


def _invalid_value(param: str, detail: str) -> Response[bytes]:
    message = f"Invalid value for '{param}': {detail}"
    return _respond(400, error_response(message, "invalid_request_error", param, "invalid_value"))


def _validation_error(request: Request, exc: ValidationException) -> Response[bytes]:
    if request.headers.get("content-length", "0") == "0" and request.method == "POST":
        message = "A request body is required"
        return _respond(400, error_response(message, "invalid_request_error", None, None))
    problems = exc.extra if isinstance(exc.extra, list) else []
    first = problems[0] if problems and isinstance(problems[0], dict) else {}
    detail = first.get("message") or exc.detail
    param = first.get("key")
    if param in (None, "data"):  # the whole body: name the field when msgspec does
        missing = _MISSING_FIELD.search(detail)
        if missing:
            message = f"'{missing.group(1)}' is required"
            return _respond(
                400, error_response(message, "invalid_request_error", missing.group(1), "missing")
            )
        param = None
    if param:
        return _invalid_value(param, detail)
    message = f"Invalid request body: {detail}"
    return _respond(400, error_response(message, "invalid_request_error", None, "invalid_value"))


def _http_error(_: Request, exc: HTTPException) -> Response[bytes]:
    # Litestar blames a body field that shares its name with a dependency on the
    # dependency, and answers 500 (seen when the gateway's dependency was named like
    # ModelSpec's `runtime` field); it is the client's field.
    if isinstance(exc, InternalServerException) and isinstance(
        exc.__cause__, msgspec.ValidationError
    ):
        body_field = _BODY_FIELD.match(str(exc.__cause__))
        if body_field:
            return _invalid_value(body_field.group(2), body_field.group(1))
    status = exc.status_code
    type_, code = _TYPES_BY_STATUS.get(
        status, ("invalid_request_error" if status < 500 else "server_error", None)
    )
    detail = exc.detail
    if isinstance(exc.__cause__, SerializationException):
        detail = f"The request body could not be parsed: {detail}"
    return _respond(status, error_response(detail, type_, None, code))


def _recursion_error(request: Request, exc: RecursionError) -> Response[bytes]:
    # msgspec bounds how deep it decodes and raises RecursionError past it: a body of
    # "[[[[..." is the client's mistake. Any other recursion is a bug, so a 500.
    if "deserializing" not in str(exc):
        return _unexpected_error(request, exc)
    message = "The request body could not be parsed: it is nested too deeply"
    return _respond(400, error_response(message, "invalid_request_error", None, None))


def _unexpected_error(request: Request, exc: Exception) -> Response[bytes]:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _respond(500, error_response("Internal server error", "server_error", None, None))


exception_handlers = {
    ShoalError: _shoal_error,
    ValidationException: _validation_error,
    HTTPException: _http_error,
    RecursionError: _recursion_error,
    Exception: _unexpected_error,
}


_ERRORS_BY_CODE: dict[FailureCode, type[ShoalError]] = {
    FailureCode.INVALID_INPUT: InvalidRequestError,
    FailureCode.DEADLINE_EXCEEDED: GatewayTimeoutError,
    FailureCode.NOT_FOUND: NotFoundError,
    FailureCode.UNAVAILABLE: UnavailableError,
    FailureCode.INTERNAL: InternalError,
}


def as_shoal_error(exc: Exception, model: str) -> Exception:
    """The one table from queue-layer failures to HTTP errors."""
    match exc:
        case JobFailedError(failure=failure):
            return _ERRORS_BY_CODE[failure.code](failure.message, param=failure.param or None)
        case QueueFullError():
            return OverloadedError(
                "The work queue is full; retry after a moment", retry_after=exc.retry_after
            )
        case BacklogTooLongError():
            return UnavailableError(
                f"Model '{model}' has a backlog its workers would not finish before this "
                "request's deadline; retry after a moment",
                code="backlog_too_long",
                retry_after=exc.retry_after,
            )
        case NoWorkerError():
            return UnavailableError(
                f"No worker is serving model '{model}' right now",
                code="no_worker",
                retry_after=exc.retry_after,
            )
        case PayloadStoreError():
            log.warning("payload store: %s", exc)
            return UnavailableError(
                "The request is too large for one queue message and the payload store "
                "is unreachable; retry after a moment",
                code="payload_store_unavailable",
                retry_after=exc.retry_after,
            )
        case QueueUnavailableError():
            log.warning("queue unavailable: %s", exc)
            return UnavailableError(
                "The work queue is unreachable; retry after a moment",
                retry_after=exc.retry_after,
            )
        case DeadlineExceededError():
            return GatewayTimeoutError("The request was not answered before its deadline")
        case _:
            return exc


_encode = msgspec.json.Encoder().encode


async def send_error(
    send: Any, exc: ShoalError, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Answer `exc` straight from an ASGI middleware (before routing or the body), in the
    same envelope, with `Retry-After` when it has one."""
    body = _encode(exc.to_response())
    head = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *headers,
    ]
    if exc.retry_after:
        head.append((b"retry-after", str(max(1, math.ceil(exc.retry_after))).encode()))
    await send({"type": "http.response.start", "status": exc.status_code, "headers": head})
    await send({"type": "http.response.body", "body": body})
