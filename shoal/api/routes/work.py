"""The routes that run inputs on workers, one per row of the route table (endpoints.py):
JSON in, the compat module's response out, or server-sent events for a generation
request that asks to stream."""

from __future__ import annotations

from typing import Any

from litestar import Response, post
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec
from litestar.response import Stream

from ..answer import answer, generate
from ..endpoints import ENDPOINTS, Endpoint
from ..gateway import Gateway, GatewayDep
from ._openapi import WORK_ERRORS

__all__ = ["WORK_ROUTES"]


async def _answer(gateway: Gateway, data: Any) -> Response:
    body, headers = await answer(gateway, data)
    return Response(body, headers=headers)


def _route(endpoint: Endpoint) -> HTTPRouteHandler:
    respond = generate if endpoint.streams else _answer

    async def create(data: Any, gateway: Any) -> Any:
        return await respond(gateway, data)

    # Litestar reads a handler's types from its annotations: these are the row's, so the
    # body is decoded and validated as its request and the docs show its response.
    returns: Any = Response[endpoint.response]  # type: ignore[name-defined]
    create.__annotations__ = {
        "data": endpoint.request,
        "gateway": GatewayDep,
        "return": returns | Stream if endpoint.streams else returns,
    }
    responses = dict(WORK_ERRORS)
    if endpoint.streams:  # the union hides the JSON answer from the docs: named here
        responses[200] = ResponseSpec(
            endpoint.response,
            description="The whole answer; `text/event-stream` chunks when `stream` is true",
            generate_examples=False,
        )
    return post(
        list(endpoint.paths),
        status_code=200,
        summary=endpoint.summary,
        tags=[endpoint.tag],
        responses=responses,
    )(create)


WORK_ROUTES: tuple[HTTPRouteHandler, ...] = tuple(_route(e) for e in ENDPOINTS)
