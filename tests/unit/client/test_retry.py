"""Which answers the client retries, for how long, and the typed errors it raises."""

from __future__ import annotations

import httpx

from shoal.client import (
    BadRequestError,
    NotFoundError,
    RateLimitError,
    RetryPolicy,
    ServerError,
    UnavailableError,
)
from shoal.client.errors import error_from_response


def answer(status: int, code: str, retry_after: str | None = None) -> httpx.Response:
    headers = {"retry-after": retry_after} if retry_after else {}
    body = {"error": {"message": "m", "type": "t", "param": "p", "code": code}}
    return httpx.Response(status, json=body, headers=headers)


def test_statuses_map_to_typed_errors_with_their_code_and_retry_after() -> None:
    full = error_from_response(answer(429, "queue_full", "3"))
    assert isinstance(full, RateLimitError)
    assert (full.status, full.code, full.param, full.retry_after) == (429, "queue_full", "p", 3.0)
    assert isinstance(error_from_response(answer(400, "invalid")), BadRequestError)
    assert isinstance(error_from_response(answer(404, "model_not_found")), NotFoundError)
    assert isinstance(error_from_response(answer(503, "no_worker")), UnavailableError)
    odd = error_from_response(httpx.Response(502, text="<html>bad gateway</html>"))
    assert isinstance(odd, ServerError)
    assert odd.code is None and "bad gateway" in odd.message


def test_only_overload_and_dropped_connections_are_retried_with_growing_waits() -> None:
    policy = RetryPolicy(max_retries=3, backoff=0.5, max_backoff=1.5)
    full = error_from_response(answer(429, "queue_full", "2"))
    assert policy.delay(0, full) == 2.0  # the server's Retry-After wins when longer
    busy = error_from_response(answer(503, "no_worker"))
    assert [policy.delay(n, busy) for n in range(4)] == [0.5, 1.0, 1.5, None]
    assert policy.delay(0, httpx.ConnectError("refused")) == 0.5
    assert policy.delay(0, error_from_response(answer(400, "invalid"))) is None
    assert policy.delay(0, ValueError("not ours")) is None
