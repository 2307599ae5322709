"""POST /v1/embeddings (OpenAI-compatible)."""

from __future__ import annotations

from litestar import Controller, Response, post

from ...compat.openai import EmbeddingRequest, EmbeddingResponse
from ..answer import answer
from ..gateway import GatewayDep
from ._openapi import WORK_ERRORS

__all__ = ["EmbeddingsController"]


class EmbeddingsController(Controller):
    path = "/v1/embeddings"
    tags = ["OpenAI"]

    @post(status_code=200, summary="Create embeddings", responses=WORK_ERRORS)
    async def create(
        self, data: EmbeddingRequest, gateway: GatewayDep
    ) -> Response[EmbeddingResponse]:
        body, headers = await answer(gateway, data)
        return Response(body, headers=headers)  # type: ignore[arg-type]
