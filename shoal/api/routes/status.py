"""GET /metrics (Prometheus text), GET /status (the live status page) and its
GET /status.json. Public like /health: they show model names and counts, never keys or
request bodies. Recent errors' messages (which may name keys, paths and sources) are in
/status.json for operators only: everyone without keys, an admin key with them."""

from __future__ import annotations

from importlib import resources
from typing import Any

from litestar import Controller, MediaType, Request, Response, get
from litestar.datastructures import State

from ... import telemetry

__all__ = ["StatusController"]

_PAGE = resources.files("shoal.api").joinpath("static/status.html")


class StatusController(Controller):
    tags = ["Status"]

    @get("/metrics", summary="Metrics in Prometheus text format", include_in_schema=False)
    async def metrics(self, state: State) -> Response[bytes]:
        await state.status.refresh()
        body, content_type = telemetry.metrics_text()
        return Response(body, media_type=content_type)

    @get("/status", summary="Live status page", media_type=MediaType.HTML)
    async def page(self) -> Response[bytes]:
        return Response(_PAGE.read_bytes(), media_type=MediaType.HTML)

    @get("/status.json", summary="What the status page shows", include_in_schema=False)
    async def document(self, state: State, request: Request) -> dict[str, Any]:
        operator = state.admission.is_operator(request.headers.get("authorization"))
        return await state.status.document(operator)
