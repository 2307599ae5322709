"""The error responses each route documents: OpenAI's envelope, as the gateway sends them.

Litestar documents a 400 on every route with parameters as its own
`{status_code, detail, extra}`; the exception handlers (shoal/api/errors.py) never send
that shape, so every route names its error statuses here and they replace Litestar's.
"""

from __future__ import annotations

from litestar.openapi.datastructures import ResponseSpec

from ...compat.errors import ErrorResponse

__all__ = ["CHANGE_ERRORS", "RESOURCE_ERRORS", "WORK_ERRORS", "error_responses"]

_DESCRIPTIONS = {
    400: "The request is invalid: its body, a parameter or an input",
    401: "No valid API key (when the gateway has keys)",
    403: "The API key may not call this route or use this model",
    404: "No such model, adapter, file or batch",
    409: "The change conflicts with the current state",
    413: "The request is larger than the gateway accepts, or the key's files fill its "
    "storage quota (code `storage_quota_exceeded`)",
    415: "The body's content type is not one this route reads",
    429: "A rate limit of the key, or the gateway or its queue is full; see Retry-After",
    503: "No worker serves the model now, or the queue is unreachable; see Retry-After",
    504: "The request was not answered before its deadline",
}


def error_responses(*statuses: int) -> dict[int, ResponseSpec]:
    """OpenAI's error envelope for a 400 and each of `statuses`."""
    return {
        status: ResponseSpec(
            ErrorResponse, description=_DESCRIPTIONS[status], generate_examples=False
        )
        for status in sorted({400, *statuses})
    }


WORK_ERRORS = error_responses(401, 403, 404, 413, 429, 503, 504)
"""Routes that run inputs on workers."""
RESOURCE_ERRORS = error_responses(401, 403, 404, 429)
"""Routes that read files, batches and models (or delete files)."""
CHANGE_ERRORS = error_responses(401, 403, 404, 409, 429)
"""Routes that change models, adapters and batches."""
