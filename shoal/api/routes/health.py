"""GET /health (the process is alive), GET /ready (a request would be served now), and
GET / (to the API docs, for whoever opens the gateway's address in a browser)."""

from __future__ import annotations

import msgspec
from litestar import Controller, Response, get
from litestar.response import Redirect

from ..gateway import GatewayDep

__all__ = ["HealthController"]


class Health(msgspec.Struct):
    status: str


class Readiness(msgspec.Struct):
    status: str
    nats_connected: bool
    ready_models: list[str]
    workers: int


class HealthController(Controller):
    tags = ["Health"]

    @get("/", include_in_schema=False)
    async def index(self) -> Redirect:
        return Redirect("/docs")

    @get("/health", summary="Liveness")
    async def health(self) -> Health:
        return Health("ok")

    @get("/ready", summary="Readiness: NATS reachable and a worker ready for some model")
    async def ready(self, gateway: GatewayDep) -> Response[Readiness]:
        connected = gateway.bus.is_connected
        workers = gateway.dispatcher.live_workers()
        models = sorted(gateway.dispatcher.ready_models())
        ok = connected and bool(models)
        body = Readiness("ready" if ok else "not_ready", connected, models, len(workers))
        return Response(body, status_code=200 if ok else 503)
