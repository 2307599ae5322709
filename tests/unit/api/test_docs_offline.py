"""`/docs` is whole without the internet: the page names no other host, and every file it
loads is served by the gateway itself."""

from __future__ import annotations

import re

from litestar.testing import TestClient

from shoal.api.app import create_app
from shoal.config import Settings


def test_the_api_docs_load_everything_from_the_gateway() -> None:
    client = TestClient(create_app(Settings()), base_url="http://127.0.0.1:8000")
    page = client.get("/docs")  # no lifespan: the page needs no NATS
    assert page.status_code == 200, page.text
    html = page.text
    assert not re.search(r"(src|href)=['\"]https?://", html), html
    assets = re.findall(r"(?:src|href)=['\"](/[^'\"]+)['\"]", html)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets), assets
    for asset in assets:
        served = client.get(asset)
        assert served.status_code == 200 and len(served.content) > 1000, asset
    assert client.get("/docs/openapi.json").json()["openapi"].startswith("3.1")
    # Whoever opens the gateway's address in a browser lands on them.
    root = client.get("/", follow_redirects=False)
    assert (root.status_code, root.headers["location"]) == (302, "/docs")
