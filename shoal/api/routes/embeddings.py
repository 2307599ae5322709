"""POST /v1/embeddings (OpenAI-compatible)."""

from __future__ import annotations

from litestar import Controller, Response, post

from ...compat.openai import EmbeddingRequest, EmbeddingResponse
from ..runtime import RuntimeDep
from ._timing import timing_headers

__all__ = ["EmbeddingsController"]


class EmbeddingsController(Controller):
    path = "/v1/embeddings"
    tags = ["OpenAI"]

    @post(status_code=200, summary="Create embeddings")
    async def create(
        self, data: EmbeddingRequest, runtime: RuntimeDep
    ) -> Response[EmbeddingResponse]:
        target = runtime.resolve(data.model, "embed", data.shoal)
        texts, token_ids = data.inputs()
        vectors = await runtime.embed(target, data.options(), texts=texts, token_ids=token_ids)
        body = EmbeddingResponse.from_vectors(vectors, target.name, data.encoding_format)
        return Response(body, headers=timing_headers(vectors))
