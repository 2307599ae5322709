"""POST /v1/embeddings (OpenAI-compatible)."""

from __future__ import annotations

from litestar import Controller, Response, post

from ...compat.openai import EmbeddingRequest, EmbeddingResponse
from .. import endpoints
from ..runtime import RuntimeDep
from ._openapi import WORK_ERRORS
from ._timing import timing_headers

__all__ = ["EmbeddingsController"]


class EmbeddingsController(Controller):
    path = "/v1/embeddings"
    tags = ["OpenAI"]

    @post(status_code=200, summary="Create embeddings", responses=WORK_ERRORS)
    async def create(
        self, data: EmbeddingRequest, runtime: RuntimeDep
    ) -> Response[EmbeddingResponse]:
        body, vectors = await endpoints.embeddings(runtime, data)
        return Response(body, headers=timing_headers(vectors))
