"""POST /native/v1/{embed,ner,multivector}: MessagePack in and out, vectors as raw buffers."""

from __future__ import annotations

from typing import Annotated

import msgspec
from litestar import Controller, Request, Response, post
from litestar.enums import RequestEncodingType
from litestar.params import Body

from ...compat.errors import UnsupportedMediaTypeError
from ...compat.native import NativeEmbedRequest, NativeEmbedResponse
from ...compat.tasks import (
    NativeMultiVectorRequest,
    NativeMultiVectorResponse,
    NativeNerRequest,
    NerResponse,
)
from ..runtime import RuntimeDep
from ._openapi import error_responses
from ._timing import timing_headers

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
        runtime: RuntimeDep,
    ) -> Response[bytes]:
        target = runtime.resolve(data.model, "embed", data.shoal)
        vectors = await runtime.embed(target, data.options(), texts=data.texts())
        body = _encode(NativeEmbedResponse.from_vectors(vectors, target.name))
        return Response(body, media_type=MSGPACK, headers=timing_headers(vectors))

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
        runtime: RuntimeDep,
    ) -> Response[bytes]:
        target = runtime.resolve(data.model, "ner", data.shoal)
        texts = data.texts()
        limits = runtime.settings.gateway
        results = await runtime.run(target, lambda env: data.to_jobs(env, limits))
        return Response(
            _encode(NerResponse.from_results(texts, results, target.name)), media_type=MSGPACK
        )

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
        runtime: RuntimeDep,
    ) -> Response[bytes]:
        target = runtime.resolve(data.model, "multivector", data.shoal)
        dims = target.spec.multivector.dims or target.spec.dims
        limits = runtime.settings.gateway
        results = await runtime.run(
            target, lambda env: data.to_jobs(env, limits, dims, target.spec.max_length, data.dtype)
        )
        body = NativeMultiVectorResponse.from_results(results, target.name)  # type: ignore[arg-type]
        return Response(_encode(body), media_type=MSGPACK)
