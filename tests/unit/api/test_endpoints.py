"""The route table (shoal/api/endpoints.py) against the app the gateway serves: every route
that reaches a model or a key's data is in a route group, and what a batch line may name
is a POST route of the group that lists it."""

from __future__ import annotations

from shoal.api.answer import BATCH_ENDPOINTS
from shoal.api.app import create_app
from shoal.api.endpoints import GROUPS, ROUTE_GROUPS, WORK_GROUPS, batchable, route_group
from shoal.config import Settings

PUBLIC = {"/", "/health", "/ready", "/status", "/status.json", "/metrics"}
"""Routes no key right covers: probes, metrics, the status pages, `/` (to the docs)."""


def _routes() -> dict[str, set[str]]:
    return {r.path: set(r.methods) for r in create_app(Settings()).routes}


def test_every_served_route_is_public_or_in_a_route_group() -> None:
    ungrouped = {
        path
        for path in _routes()
        if route_group(path) is None
        and path not in PUBLIC
        and not path.startswith(("/docs", "/docs-assets"))
    }
    assert not ungrouped, f"add these to a route group in shoal/api/endpoints.py: {ungrouped}"


def test_every_batchable_path_is_a_post_route_of_its_own_group() -> None:
    routes = _routes()
    for group in GROUPS:
        for path in group.batch:
            assert "POST" in routes[path], path
            assert route_group(path) == group.name, path
    assert set(BATCH_ENDPOINTS) == set(batchable())


def test_groups_keys_may_name_and_the_ones_that_wait_on_workers() -> None:
    assert "admin" not in ROUTE_GROUPS and len(set(ROUTE_GROUPS)) == len(ROUTE_GROUPS)
    assert {"models", "files", "batches", "admin"}.isdisjoint(WORK_GROUPS)
    assert route_group("/v1/chat/completions") == "chat"
    assert route_group("/native/v1/embed") == "native"
    assert route_group("/v1/score") == route_group("/score") == "rerank"
    assert route_group("/docs") is None
