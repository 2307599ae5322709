"""`/docs` renders in a real browser with no network but the gateway: Chromium, every
request to another host refused, and Swagger UI still lists the routes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from shoal.api.app import create_app
from shoal.config import Settings
from tests.helpers import app_in_thread

from .test_observability import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture(scope="module")
def docs_url() -> Iterator[str]:
    """The gateway app without its lifespan: the docs need no NATS."""
    with app_in_thread(create_app(Settings())) as port:
        yield f"http://127.0.0.1:{port}"


def test_the_api_docs_render_offline_in_chromium(docs_url: str) -> None:
    from playwright.sync_api import Route, sync_playwright

    assert Path(CHROMIUM).exists(), "install Debian's chromium (make setup does)"
    elsewhere: list[str] = []
    problems: list[str] = []

    def only_the_gateway(route: Route) -> None:
        if urlparse(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:  # as on an air-gapped cluster: nothing else answers
            elsewhere.append(route.request.url)
            route.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.route("**/*", only_the_gateway)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.goto(f"{docs_url}/")  # `/` leads to the docs
            assert page.url == f"{docs_url}/docs"
            page.wait_for_selector(".opblock-summary-path", timeout=30_000)
            paths = page.locator(".opblock-summary-path").all_text_contents()
        finally:
            browser.close()
    assert not elsewhere, elsewhere
    assert not problems, problems
    assert {"/v1/embeddings", "/v1/chat/completions", "/v2/rerank"} <= {
        path.replace("\u200b", "") for path in paths
    }, paths
