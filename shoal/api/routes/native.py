"""POST /native/v1/embed: MessagePack in and out, vectors as one raw buffer."""

from __future__ import annotations

from typing import Annotated

import msgspec
from litestar import Controller, Request, Response, post
from litestar.enums import RequestEncodingType
from litestar.params import Body

from ...compat.errors import UnsupportedMediaTypeError
from ...compat.native import NativeEmbedRequest, NativeEmbedResponse
from ..runtime import RuntimeDep
from ._timing import timing_headers

__all__ = ["MSGPACK", "NativeController"]

MSGPACK = "application/msgpack"
_ACCEPTED = {MSGPACK, "application/x-msgpack", "application/vnd.msgpack"}
_encode = msgspec.msgpack.Encoder().encode


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

    @post("/embed", status_code=200, media_type=MSGPACK, summary="Embed (msgpack)")
    async def embed(
        self,
        data: Annotated[NativeEmbedRequest, Body(media_type=RequestEncodingType.MESSAGEPACK)],
        runtime: RuntimeDep,
    ) -> Response[bytes]:
        spec = runtime.resolve(data.model)
        vectors = await runtime.embed(spec, data.options(), texts=data.inputs)
        body = _encode(NativeEmbedResponse.from_vectors(vectors, spec.id))
        return Response(body, media_type=MSGPACK, headers=timing_headers(vectors))
