"""The route table (shoal/api/endpoints.py) against the app the gateway serves: every route
that reaches a model or a key's data is in a route group, and what a batch line may name
is a POST route of the group that lists it."""

from __future__ import annotations

from shoal.api.answer import BATCH_ENDPOINTS
from shoal.api.app import create_app
from shoal.api.endpoints import ENDPOINTS, GROUPS, ROUTE_GROUPS, WORK_GROUPS, batchable, route_group
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


def test_every_endpoint_is_a_post_route_of_its_own_group_and_batch_lines_name_them() -> None:
    routes = _routes()
    for group in GROUPS:
        for endpoint in group.endpoints:
            for path in endpoint.paths:
                assert "POST" in routes[path], path
                assert route_group(path) == group.name, path
    assert set(BATCH_ENDPOINTS) == set(batchable())
    assert {"/v1/embeddings", "/v1/chat/completions", "/v2/rerank"} <= set(batchable())


def test_each_endpoint_decodes_its_own_request_and_documents_its_response() -> None:
    """The routes are built from the rows: the docs show each row's request and response
    (an unknown field in the body is the request Struct's to refuse)."""
    schema = create_app(Settings()).openapi_schema.to_schema()
    for endpoint in ENDPOINTS:
        operation = schema["paths"][endpoint.paths[0]]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert body.endswith(endpoint.request.__name__), (endpoint.paths, body)
        ok = str(operation["responses"]["200"]["content"])
        assert endpoint.response.__name__ in ok, (endpoint.paths, ok)
        assert operation["summary"] == endpoint.summary


def test_groups_keys_may_name_and_the_ones_that_wait_on_workers() -> None:
    assert "admin" not in ROUTE_GROUPS and len(set(ROUTE_GROUPS)) == len(ROUTE_GROUPS)
    assert {"models", "files", "batches", "admin"}.isdisjoint(WORK_GROUPS)
    assert route_group("/v1/chat/completions") == "chat"
    assert route_group("/native/v1/embed") == "native"
    assert route_group("/v1/score") == route_group("/score") == "rerank"
    assert route_group("/tokenize") == route_group("/detokenize") == "tokenize"
    assert route_group("/tei/m/tokenize") == "tei"
    assert route_group("/docs") is None
