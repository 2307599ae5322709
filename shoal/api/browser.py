"""Requests a browser makes on a page's behalf: refused unless they come from where the
gateway is meant to be called from.

A web page the local user opens can make their browser send requests to
`http://127.0.0.1:8000`: plain form posts and `text/plain` or multipart bodies go without
a CORS preflight (CSRF), and a name the page's server controls can be re-pointed at
127.0.0.1 so its scripts read the answers (DNS rebinding). Without API keys nothing else
stands in the way, so, before anything else runs:

1. without keys, on a loopback bind, the `Host` a request names must be a loopback name
   (`localhost`, `127.0.0.1`, `[::1]`) or one of `gateway.allowed_hosts`: a rebound name
   is 403;
2. a state-changing request (POST, PUT, PATCH, DELETE) from a page of another origin
   (its `Origin` header is neither the gateway's own nor one of `gateway.cors_origins`)
   is 403, keys or not; CORS (preflights included) is answered for `cors_origins` only;
3. routes that take JSON take only a JSON `Content-Type` (415 otherwise), so a body a
   page could post without a preflight is never decoded as a request.

Clients that are not browsers (SDKs, curl, httpx) send no `Origin` and a JSON content
type, and reach the gateway by the address it serves on, so none of this touches them.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from ..compat.errors import ShoalError, UnsupportedMediaTypeError
from ..config import Settings
from .errors import send_error
from .keys import PermissionDeniedError

__all__ = ["BrowserGuard", "BrowserPolicy"]

_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_NOT_JSON_ROUTES = ("/native/",)
"""Paths whose bodies are not JSON (each checks its own content type); `/v1/files` takes
multipart uploads (exact path, below)."""
_UPLOADS = frozenset({"/v1/files"})


def _is_loopback_name(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(authority: str) -> str:
    """`example.org` of `example.org:8000`, `::1` of `[::1]:8000`, lower case."""
    return (urlsplit(f"//{authority}").hostname or "").lower()


class BrowserPolicy:
    """The gateway's settings as the guard reads them, computed once per app."""

    def __init__(self, settings: Settings) -> None:
        gateway = settings.gateway
        self.check_host = not settings.auth.configured and (
            _is_loopback_name(gateway.host) or bool(gateway.allowed_hosts)
        )
        """Without keys only (a rebound page has no key to send), on a loopback bind or
        where names are listed: a keyless non-loopback bind has an authenticating proxy
        in front (`auth.allow_unauthenticated`), which a rebound page cannot pass."""
        self.allowed_hosts = frozenset(h.lower() for h in gateway.allowed_hosts)
        self.cors_origins = frozenset(o.rstrip("/").lower() for o in gateway.cors_origins)

    def refusal(self, method: str, path: str, headers: dict[bytes, bytes]) -> ShoalError | None:
        """Why a request is refused, or None to let it in."""
        host = headers.get(b"host", b"").decode("latin-1")
        if self.check_host:
            name = _host_name(host)
            if not (_is_loopback_name(name) or name in self.allowed_hosts):
                return PermissionDeniedError(
                    f"This gateway serves without API keys on loopback only; the host name "
                    f"'{name}' is not one of its names (add it to gateway.allowed_hosts if "
                    "it is meant to reach this gateway)",
                    code="host_not_allowed",
                )
        if method not in _CHANGING:
            return None
        origin = headers.get(b"origin")
        if origin is not None:
            seen = origin.decode("latin-1").rstrip("/").lower()
            own = {f"http://{host.lower()}", f"https://{host.lower()}"}
            if seen not in own and seen not in self.cors_origins:
                return PermissionDeniedError(
                    f"Requests from pages of another origin ('{seen}') are refused; list it "
                    "in gateway.cors_origins to allow it",
                    code="cross_origin_refused",
                )
        if path in _UPLOADS or path.startswith(_NOT_JSON_ROUTES):
            return None
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        media = content_type.split(";")[0].strip().lower()
        if media and media != "application/json" and not media.endswith("+json"):
            return UnsupportedMediaTypeError(
                f"This route takes JSON bodies; send 'content-type: application/json', "
                f"not '{media}'"
            )
        return None


class BrowserGuard:
    """ASGI middleware applying `BrowserPolicy` before the body is read."""

    def __init__(self, app: Any, policy: BrowserPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            refusal = self.policy.refusal(scope["method"], scope["path"], headers)
            if refusal is not None:
                await send_error(send, refusal)
                return
        await self.app(scope, receive, send)
