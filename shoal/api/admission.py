"""Who may come in, and how many: the gateway's admission middleware.

Before a request's body is read, in this order:

1. API key (when keys are configured): 401 without a known `Authorization: Bearer` key;
2. permission: 403 for a route group the key may not call (`/admin` needs an admin key);
3. rate limits of the key (requests per minute, and tokens per minute on the routes that
   do work): 429 with `Retry-After` and `x-ratelimit-*` headers (sent on every response
   of a rate-limited key);
4. the gateway's in-flight bounds on work routes, on requests and on their body bytes:
   429 with `Retry-After`, so under overload its memory stays bounded by
   `max_in_flight` requests and `max_body_bytes_in_flight` bytes, not by the load.

A work request then runs as its own task, cancelled if the client leaves before the
response is sent (the dispatcher then tells workers to drop its work), with two context
variables the runtime reads: the caller (for the model allowlist) and a usage meter
(tokens used, charged to the key's allowance at the end).

A batch line is checked the same way when it runs (`Admission.admit_line`): the route group of the
batch's endpoint, the model allowlist, and the tokens per minute, which its usage is
charged to (`Admission.metered`). Lines are not HTTP requests, so they take nothing from the
requests per minute; the batch's own flow control bounds how many run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..compat.errors import OverloadedError, ShoalError
from ..config import Settings
from ..sysmem import memory_limit
from .endpoints import WORK_GROUPS, route_group
from .errors import send_error
from .keys import KeyRing, PermissionDeniedError, Principal
from .ratelimit import RateLimiter

__all__ = [
    "Admission",
    "AdmissionMiddleware",
    "UsageMeter",
    "caller_may_use",
    "caller_name",
    "caller_scope",
    "current_principal",
    "current_usage",
    "meter_usage",
]

log = logging.getLogger(__name__)


class UsageMeter:
    """Tokens a request used (input + output), as workers reported them."""

    __slots__ = ("tokens",)

    def __init__(self) -> None:
        self.tokens = 0


current_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "shoal_principal", default=None
)
current_usage: contextvars.ContextVar[UsageMeter | None] = contextvars.ContextVar(
    "shoal_usage", default=None
)


def caller_name() -> str:
    """The current caller's key name, which owns what it creates ("" without keys)."""
    principal = current_principal.get()
    return "" if principal is None else principal.name


def caller_scope() -> str | None:
    """Whose files and batches the current caller sees: its own (its key's name), or
    everyone's (None) without keys or with an admin key."""
    principal = current_principal.get()
    return None if principal is None or principal.admin else principal.name


def caller_may_use(*names: str) -> bool:
    """Whether the current caller may use a model known by any of `names` (always,
    without keys)."""
    principal = current_principal.get()
    return principal is None or principal.may_use(*names)


def meter_usage(tokens: int) -> None:
    """Count tokens the current request used toward its key's tokens-per-minute."""
    meter = current_usage.get()
    if meter is not None:
        meter.tokens += tokens


class RateLimitedError(ShoalError):
    """OpenAI's shape: code `rate_limit_exceeded`, type the limit hit (`requests` or
    `tokens`)."""

    status_code = 429
    code = "rate_limit_exceeded"

    def __init__(self, message: str, limit: str, retry_after: float) -> None:
        super().__init__(message, retry_after=retry_after)
        self.openai_type = limit


class Admission:
    """The state admission shares across routes and the batch runner: Litestar builds a
    middleware instance per route handler, so keys, buckets and the in-flight count live
    here, once per app."""

    def __init__(self, settings: Settings) -> None:
        self._auth = settings.auth
        self._keys_text = self._read_keys_file()
        self.keys = KeyRing(settings.auth, self._keys_text)
        """The keys now; replaced whole when the keys file changes (`watch_keys`)."""
        self.limiter = RateLimiter()
        limits = settings.gateway
        self.max_in_flight = limits.max_in_flight
        self.in_flight = 0
        self.max_body_bytes = limits.max_body_bytes
        self.body_budget = max(
            limits.max_body_bytes_in_flight or memory_limit() // 16, limits.max_body_bytes
        )
        """Body bytes work requests may hold at once (see the setting)."""
        self.body_bytes = 0

    def _read_keys_file(self) -> bytes | None:
        path = self._auth.keys_file
        try:
            return Path(path).read_bytes() if path else None
        except OSError as exc:
            raise ValueError(f"keys file {path}: {exc.strerror}") from exc

    def reload_keys(self) -> bool:
        """Take the keys file's keys if it changed and holds valid entries (else keep the
        keys in use and log why, once per change); whether the keys changed."""
        try:
            text = self._read_keys_file()
        except ValueError as exc:
            log.error("%s; keeping the keys in use", exc)
            return False
        if text == self._keys_text:
            return False
        self._keys_text = text
        try:
            ring = KeyRing(self._auth, text)
        except ValueError as exc:
            log.error("keys file changed but %s; keeping the keys in use", exc)
            return False
        self.keys = ring
        log.info("keys file changed: %d API key(s) now", len(ring))
        return True

    async def watch_keys(self) -> None:
        """Re-read the keys file every `auth.reload_seconds`, so a key added, rotated or
        revoked there counts on every gateway without a restart (a Kubernetes secret
        mounted as the file changes in place)."""
        if not self._auth.keys_file:
            return
        while True:
            await asyncio.sleep(self._auth.reload_seconds)
            self.reload_keys()

    def is_operator(self, authorization: str | None) -> bool:
        """Whether the caller may see what only operators see (error messages naming keys,
        paths and sources on the status page): anyone without keys, an admin key with
        them. Public routes call it; a bad key is simply not an operator."""
        if not self.keys.enabled:
            return True
        try:
            return self.keys.authenticate(authorization).may_call("admin")
        except ShoalError:
            return False

    def admit_line(self, principal: Principal, group: str) -> None:
        """Check a batch line as its live request would be checked when it runs.

        Raises:
            PermissionDeniedError: the key may not call `group` (any more).
            RateLimitedError: the key's tokens per minute are spent (the runner retries
                after `retry_after`, so a batch goes at the key's token rate).
        """
        if not principal.may_call(group):
            raise _denied(principal, group)
        wait = self.limiter.tokens_wait(principal.name, principal.tpm)
        if wait:
            raise _over_limit(principal, "tokens", wait)

    @contextlib.contextmanager
    def metered(self, principal: Principal | None) -> Iterator[UsageMeter]:
        """Count the tokens used inside (`meter_usage`) and charge them to `principal`'s
        tokens per minute at the end."""
        meter = UsageMeter()
        token = current_usage.set(meter)
        try:
            yield meter
        finally:
            current_usage.reset(token)
            if principal is not None:
                self.limiter.charge(principal.name, principal.tpm, meter.tokens)


class AdmissionMiddleware:
    """Keys, permissions, rate limits and the in-flight bound, before a body is read."""

    def __init__(self, app: Any, admission: Admission) -> None:
        self.app = app
        self.gate = admission

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        group = route_group(scope["path"])
        if group is None:
            await self.app(scope, receive, send)
            return
        gate = self.gate
        principal: Principal | None = None
        extra: list[tuple[bytes, bytes]] = []
        counted = group in WORK_GROUPS
        try:
            if gate.keys.enabled:
                principal = gate.keys.authenticate(_header(scope, b"authorization"))
                if not principal.may_call(group):
                    raise _denied(principal, group)
                # Tokens are spent by work routes only: a key out of tokens still lists
                # models, uploads files and reads its batches' progress.
                tpm = principal.tpm if counted else 0
                if principal.rpm or tpm:
                    verdict = gate.limiter.admit(principal.name, principal.rpm, tpm)
                    extra = verdict.headers
                    if not verdict.allowed:
                        raise _over_limit(principal, verdict.limit, verdict.retry_after)
            size = _body_size(scope, gate.max_body_bytes) if counted else 0
            if counted and (
                gate.in_flight >= gate.max_in_flight or gate.body_bytes + size > gate.body_budget
            ):
                raise OverloadedError(
                    "This gateway holds as many requests as it may; retry after a moment",
                    code="gateway_busy",
                    retry_after=1.0,
                )
        except ShoalError as exc:
            await send_error(send, exc, extra)
            return
        token = current_principal.set(principal)
        if extra:
            send = _with_headers(send, extra)
        try:
            with gate.metered(principal):
                if counted:
                    gate.in_flight += 1
                    gate.body_bytes += size
                    try:
                        await _run_until_disconnect(self.app, scope, receive, send)
                    finally:
                        gate.in_flight -= 1
                        gate.body_bytes -= size
                else:
                    await self.app(scope, receive, send)
        finally:
            current_principal.reset(token)


async def _run_until_disconnect(app: Any, scope: Any, receive: Any, send: Any) -> None:
    """Run the request, cancelling it if the client leaves before its response is sent:
    the cancellation reaches the dispatcher, which tells the workers to drop the request's
    queued and running work. (Servers do not cancel a handler when its client goes; once
    the body is read, the next `receive` returns only on disconnect.)"""
    body_read = asyncio.Event()
    responded = left = False

    async def receiving() -> Any:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            body_read.set()
        return message

    async def sending(message: Any) -> None:
        nonlocal responded
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            responded = True
        await send(message)

    async def watch(task: asyncio.Task) -> None:
        nonlocal left
        await body_read.wait()
        message = await receive()
        if message["type"] == "http.disconnect" and not responded and not task.done():
            log.debug("client left %s before its response; cancelling it", scope["path"])
            left = True
            task.cancel()

    task = asyncio.ensure_future(app(scope, receiving, sending))
    watcher = asyncio.ensure_future(watch(task))
    try:
        await task
    except asyncio.CancelledError:
        if not left:
            raise  # cancelled from outside (shutdown), not because the client left
    finally:
        watcher.cancel()


def _over_limit(principal: Principal, limit: str, retry_after: float) -> ShoalError:
    log.info("key %s over its %s limit", principal.name, limit)
    return RateLimitedError(
        f"Rate limit reached for key '{principal.name}' on {limit} per minute; "
        f"retry after {retry_after:.1f}s",
        limit,
        retry_after,
    )


def _denied(principal: Principal, group: str) -> ShoalError:
    what = "the admin API" if group == "admin" else f"the {group} API"
    return PermissionDeniedError(f"The API key '{principal.name}' may not call {what}")


def _body_size(scope: Any, largest: int) -> int:
    """The bytes a request's body will hold: its declared length, or the largest body
    allowed where it declares none (chunked) or an unreadable one (larger ones are 413)."""
    declared = _header(scope, b"content-length")
    if declared is None or not declared.isdigit():
        return largest
    return min(int(declared), largest)


def _header(scope: Any, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def _with_headers(send: Any, headers: list[tuple[bytes, bytes]]) -> Any:
    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *headers]}
        await send(message)

    return sending
