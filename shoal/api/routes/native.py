"""POST /native/v1/{embed,ner,multivector,sparse}: MessagePack in and out, vectors as raw
buffers."""

from __future__ import annotations

from typing import Annotated

import msgspec
from litestar import Controller, Request, Response, post
from litestar.enums import RequestEncodingType
from litestar.params import Body

from ...compat.errors import UnsupportedMediaTypeError
from ...compat.multivector import NativeMultiVectorRequest
from ...compat.native import NativeEmbedRequest
from ...compat.ner import NativeNerRequest
from ...compat.sparse import NativeSparseRequest
from ..answer import TaskRequest, answer
from ..gateway import Gateway, GatewayDep
from ._openapi import error_responses

__all__ = ["MSGPACK", "NativeController"]

MSGPACK = "application/msgpack"
_ACCEPTED = {MSGPACK, "application/x-msgpack", "application/vnd.msgpack"}
_encode = msgspec.msgpack.Encoder().encode
_ERRORS = error_responses(401, 403, 404, 413, 415, 429, 503, 504)


async def _require_msgpack(request: Request) -> None:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in _ACCEPTED:
        raise UnsupportedMediaTypeError(
            f"The native route takes '{MSGPACK}' bodies, not '{content_type or 'none'}'"
        )


class NativeController(Controller):
    path = "/native/v1"
    tags = ["Native"]

    # Checked before the body is decoded, so a JSON body is a 415, not a msgpack error.
    before_request = _require_msgpack

    @post(
        "/embed", status_code=200, media_type=MSGPACK, summary="Embed (msgpack)", responses=_ERRORS
    )
    async def embed(
        self,
        data: Annotated[NativeEmbedRequest, Body(media_type=RequestEncodingType.MESSAGEPACK)],
        gateway: GatewayDep,
    ) -> Response[bytes]:
        return await _answer_msgpack(gateway, data)

    @post(
        "/ner",
        status_code=200,
        media_type=MSGPACK,
        summary="Named entities (msgpack)",
        responses=_ERRORS,
    )
    async def ner(
        self,
        data: Annotated[NativeNerRequest, Body(media_type=RequestEncodingType.MESSAGEPACK)],
        gateway: GatewayDep,
    ) -> Response[bytes]:
        return await _answer_msgpack(gateway, data)

    @post(
        "/multivector",
        status_code=200,
        media_type=MSGPACK,
        summary="Token vectors (msgpack): one buffer plus row offsets",
        responses=_ERRORS,
    )
    async def multivector(
        self,
        data: Annotated[NativeMultiVectorRequest, Body(media_type=RequestEncodingType.MESSAGEPACK)],
        gateway: GatewayDep,
    ) -> Response[bytes]:
        return await _answer_msgpack(gateway, data)

    @post(
        "/sparse",
        status_code=200,
        media_type=MSGPACK,
        summary="Sparse (SPLADE) weights (msgpack): index and value buffers plus offsets",
        responses=_ERRORS,
    )
    async def sparse(
        self,
        data: Annotated[NativeSparseRequest, Body(media_type=RequestEncodingType.MESSAGEPACK)],
        gateway: GatewayDep,
    ) -> Response[bytes]:
        return await _answer_msgpack(gateway, data)


async def _answer_msgpack(gateway: Gateway, request: TaskRequest) -> Response[bytes]:
    """The same path as the JSON routes, the answer encoded as msgpack (raw buffers)."""
    body, headers = await answer(gateway, request)
    return Response(_encode(body), media_type=MSGPACK, headers=headers)
