"""`BrowserPolicy` on its own: which requests a browser page could make are refused, and
that clients which are not browsers are untouched."""

from __future__ import annotations

import pytest

from shoal.api.browser import BrowserPolicy
from shoal.config import ApiKey, Settings


def _policy(keys: bool = False, **gateway) -> BrowserPolicy:
    settings = Settings()
    for name, value in gateway.items():
        setattr(settings.gateway, name, value)
    if keys:
        settings.auth.keys = [ApiKey(name="k", sha256="0" * 64)]
    return BrowserPolicy(settings)


def _code(policy: BrowserPolicy, method: str, path: str, **headers: str) -> str | None:
    raw = {k.replace("_", "-").encode(): v.encode() for k, v in headers.items()}
    refusal = policy.refusal(method, path, raw)
    return None if refusal is None else refusal.code


SDK = {"host": "127.0.0.1:8000", "content_type": "application/json"}


@pytest.mark.parametrize(
    "host", ["127.0.0.1:8000", "localhost:8000", "[::1]:8000", "127.0.0.2", "api.localhost:1"]
)
def test_loopback_names_are_the_keyless_gateways_own(host: str) -> None:
    assert _code(_policy(), "GET", "/v1/models", host=host) is None


@pytest.mark.parametrize("host", ["attacker.example:8000", "192.168.1.5:8000", "", "10.0.0.1"])
def test_other_names_are_refused_without_keys(host: str) -> None:
    assert _code(_policy(), "GET", "/v1/models", host=host) == "host_not_allowed"


def test_configured_names_are_allowed_and_keys_make_the_name_irrelevant() -> None:
    assert _code(_policy(allowed_hosts=["Shoal.LAN"]), "GET", "/", host="shoal.lan:80") is None
    assert _code(_policy(keys=True), "GET", "/v1/models", host="attacker.example") is None


def test_a_keyless_public_bind_behind_a_proxy_checks_names_only_when_listed() -> None:
    """`allow_unauthenticated` on 0.0.0.0: the proxy in front authenticates."""
    public = _policy(host="0.0.0.0")
    assert _code(public, "GET", "/health", host="10.1.2.3:8000") is None
    listed = _policy(host="0.0.0.0", allowed_hosts=["shoal.example"])
    assert _code(listed, "GET", "/health", host="10.1.2.3:8000") == "host_not_allowed"
    assert _code(listed, "GET", "/health", host="shoal.example") is None


def test_a_foreign_origin_may_read_but_not_change() -> None:
    foreign = {**SDK, "origin": "http://attacker.example"}
    assert _code(_policy(), "GET", "/v1/files", **foreign) is None
    for method in ("POST", "DELETE", "PUT", "PATCH"):
        assert _code(_policy(), method, "/v1/files", **foreign) == "cross_origin_refused"
        assert _code(_policy(keys=True), method, "/v1/files", **foreign) == "cross_origin_refused"
    opaque = {**SDK, "origin": "null"}  # sandboxed frames, file:// pages
    assert _code(_policy(), "POST", "/v1/embeddings", **opaque) == "cross_origin_refused"


def test_the_own_origin_and_configured_ones_may_change() -> None:
    own = {**SDK, "origin": "http://127.0.0.1:8000"}
    assert _code(_policy(), "POST", "/v1/embeddings", **own) is None
    app = {**SDK, "origin": "https://app.example/"}
    assert (
        _code(_policy(cors_origins=["https://APP.example"]), "POST", "/v1/embeddings", **app)
        is None
    )


@pytest.mark.parametrize(
    ("path", "content_type", "code"),
    [
        ("/v1/embeddings", "text/plain", "unsupported_media_type"),
        ("/admin/v1/models", "application/x-www-form-urlencoded", "unsupported_media_type"),
        ("/v1/chat/completions", "multipart/form-data; boundary=x", "unsupported_media_type"),
        ("/v1/embeddings", "application/json; charset=utf-8", None),
        ("/v1/embeddings", "application/vnd.api+json", None),
        ("/v1/embeddings", "", None),  # no body type at all: not a browser's post
        ("/v1/files", "multipart/form-data; boundary=x", None),  # the upload route
        ("/native/v1/embed", "application/msgpack", None),  # checks its own type
    ],
)
def test_json_routes_take_json_bodies_only(path: str, content_type: str, code: str | None) -> None:
    headers = {"host": "127.0.0.1:8000", "content_type": content_type}
    assert _code(_policy(), "POST", path, **headers) == code
