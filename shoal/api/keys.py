"""API keys: who is calling, and what they may call.

Keys are kept as SHA-256 digests (settings never hold a key itself), so a key is found by
hashing what the client sent and looking the digest up. A key is named in logs and
errors by its `name` only.
"""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
from pathlib import Path

from ..compat.errors import ShoalError
from ..config import ApiKey, AuthSettings, Settings, read_keys
from .endpoints import ROUTE_GROUPS

__all__ = [
    "AuthenticationError",
    "KeyRing",
    "PermissionDeniedError",
    "Principal",
    "check_exposure",
    "hash_key",
    "new_key",
]


_KEY_PREFIX = "sk-shoal-"


class AuthenticationError(ShoalError):
    """401: no API key, or an unknown one."""

    status_code = 401
    openai_type = "invalid_request_error"
    code = "invalid_api_key"


class PermissionDeniedError(ShoalError):
    """403: the key may not call this route group or use this model."""

    status_code = 403
    openai_type = "invalid_request_error"
    code = "permission_denied"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh random key (256 bits), in the shape OpenAI SDKs and tools expect."""
    return _KEY_PREFIX + secrets.token_urlsafe(32)


class Principal:
    """An authenticated caller: one configured key and its limits."""

    __slots__ = ("active", "admin", "models", "name", "routes", "rpm", "tpm")

    def __init__(
        self, key: ApiKey, default_rpm: int, default_tpm: int, *, active: bool = True
    ) -> None:
        self.active = active
        self.name = key.name
        self.models = frozenset(key.models)
        self.routes = frozenset(key.routes)
        self.admin = key.admin
        self.rpm = key.rpm or default_rpm
        self.tpm = key.tpm or default_tpm

    def may_call(self, group: str) -> bool:
        if not self.active:
            return False
        if group == "admin":
            return self.admin
        return not self.routes or group in self.routes

    @classmethod
    def revoked(cls, name: str) -> Principal:
        """A key no longer configured: it may use nothing (its queued batches fail)."""
        return cls(ApiKey(name=name, sha256=""), 0, 0, active=False)

    def may_use(self, *names: str) -> bool:
        """Whether the key may use a model known by any of `names` (its id, an alias)."""
        if not self.active:
            return False
        return not self.models or any(n in self.models for n in names)


class KeyRing:
    """The configured keys (inline and from `keys_file`), by digest and by name."""

    def __init__(self, settings: AuthSettings, file_text: bytes | None = None) -> None:
        """`file_text`: the keys file's bytes, if already read (else it is read here).

        Raises:
            ValueError: a malformed entry, an unknown route group, or a name or key given
                twice (which key would a log line or an owner mean?).
        """
        self.required = settings.configured
        """Whether requests need a key: keys are given or a keys file is named."""
        keys = list(settings.keys)
        if settings.keys_file:
            keys += read_keys(Path(settings.keys_file), file_text)
        self._by_digest: dict[str, Principal] = {}
        self._by_name: dict[str, Principal] = {}
        for key in keys:
            digest = key.sha256.strip().lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError(f"API key {key.name!r}: sha256 must be 64 hex digits")
            unknown = set(key.routes) - set(ROUTE_GROUPS)
            if unknown:
                raise ValueError(
                    f"API key {key.name!r}: unknown routes {sorted(unknown)}; "
                    f"known: {', '.join(ROUTE_GROUPS)}"
                )
            if key.name in self._by_name:
                raise ValueError(f"API key name {key.name!r} is given twice")
            if digest in self._by_digest:
                raise ValueError(f"API key {key.name!r} is the same key as another entry's")
            principal = Principal(key, settings.default_rpm, settings.default_tpm)
            self._by_digest[digest] = self._by_name[key.name] = principal

    @property
    def enabled(self) -> bool:
        return self.required

    def __len__(self) -> int:
        return len(self._by_digest)

    def named(self, name: str) -> Principal:
        """The key called `name`, or a revoked stand-in when none is configured now."""
        return self._by_name.get(name) or Principal.revoked(name)

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller named by an `Authorization` header value.

        Raises:
            AuthenticationError: no bearer key, or not a configured one.
        """
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationError(
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'."
            )
        principal = self._by_digest.get(hash_key(token))
        if principal is None:
            raise AuthenticationError("Incorrect API key provided.")
        return principal


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def check_exposure(settings: Settings) -> str:
    """The gateway's start-up line on who can reach it and how they are checked.

    Raises:
        ValueError: a non-loopback bind with no API keys, unless
            `auth.allow_unauthenticated` says that is meant.
    """
    host, auth = settings.gateway.host, settings.auth
    if auth.configured:
        ring = KeyRing(auth)  # a malformed key entry stops the start, not the first request
        return f"auth: {len(ring)} API key(s) configured; requests need a Bearer key"
    if _is_loopback(host):
        return f"auth: no API keys configured; serving on loopback ({host}) only, unauthenticated"
    if auth.allow_unauthenticated:
        return f"auth: no API keys configured; serving {host} unauthenticated (allowed by settings)"
    raise ValueError(
        f"refusing to serve on {host} without API keys: add keys (`shoal keys new`), bind "
        "127.0.0.1, or set auth.allow_unauthenticated (SHOAL_AUTH__ALLOW_UNAUTHENTICATED=1) "
        "if something in front of Shoal authenticates"
    )
