"""Encoder-task routes beyond embeddings: NER, multi-vector, rerank, classify (JSON)."""

from __future__ import annotations

from litestar import Controller, Response, post

from ...compat.classify import ClassifyRequest, ClassifyResponse
from ...compat.multivector import MultiVectorRequest, MultiVectorResponse
from ...compat.ner import NerRequest, NerResponse
from ...compat.rerank import (
    CohereRerankRequest,
    CohereRerankResponse,
    RerankRequest,
    RerankResponse,
)
from ...compat.score import ScoreRequest, ScoreResponse
from ...compat.sparse import SparseRequest, SparseResponse
from ..answer import answer
from ..gateway import GatewayDep
from ._openapi import WORK_ERRORS

__all__ = [
    "ClassifyController",
    "CohereRerankController",
    "MultiVectorController",
    "NerController",
    "RerankController",
    "ScoreController",
    "SparseController",
]


class NerController(Controller):
    path = "/v1/ner"
    tags = ["Encoder tasks"]

    @post(status_code=200, summary="Named entities (token classification)", responses=WORK_ERRORS)
    async def create(self, data: NerRequest, gateway: GatewayDep) -> Response[NerResponse]:
        body, headers = await answer(gateway, data)
        return Response(body, headers=headers)  # type: ignore[arg-type]


class MultiVectorController(Controller):
    path = "/v1/multivector"
    tags = ["Encoder tasks"]

    @post(
        status_code=200,
        summary="Token vectors (late interaction, ColBERT-style)",
        responses=WORK_ERRORS,
    )
    async def create(
        self, data: MultiVectorRequest, gateway: GatewayDep
    ) -> Response[MultiVectorResponse]:
        body, headers = await answer(gateway, data)
        return Response(body, headers=headers)  # type: ignore[arg-type]


class RerankController(Controller):
    path = "/"
    tags = ["Encoder tasks"]

    @post(
        ["/v1/rerank", "/rerank"],
        status_code=200,
        summary="Rerank documents for a query",
        responses=WORK_ERRORS,
    )
    async def create(self, data: RerankRequest, gateway: GatewayDep) -> Response[RerankResponse]:
        body, headers = await answer(gateway, data)
        return Response(body, headers=headers)  # type: ignore[arg-type]


class CohereRerankController(Controller):
    path = "/v2/rerank"
    tags = ["Encoder tasks"]

    @post(
        status_code=200,
        summary="Rerank documents for a query (Cohere's v2 shape)",
        responses=WORK_ERRORS,
    )
    async def create(
        self, data: CohereRerankRequest, gateway: GatewayDep
    ) -> Response[CohereRerankResponse]:
        body, headers = await answer(gateway, data)
        return Response(body, headers=headers)  # type: ignore[arg-type]


class ScoreController(Controller):
    path = "/"
    tags = ["Encoder tasks"]

    @post(
        ["/v1/score", "/score"],
        status_code=200,
        summary="Relevance of text pairs (vLLM's score shape)",
        responses=WORK_ERRORS,
    )
    async def create(self, data: ScoreRequest, gateway: GatewayDep) -> Response[ScoreResponse]:
        body, headers = await answer(gateway, data)
        return Response(body, headers=headers)  # type: ignore[arg-type]


class SparseController(Controller):
    path = "/v1/sparse"
    tags = ["Encoder tasks"]

    @post(
        status_code=200,
        summary="Sparse (SPLADE) embeddings: nonzero vocabulary weights per text",
        responses=WORK_ERRORS,
    )
    async def create(self, data: SparseRequest, gateway: GatewayDep) -> Response[SparseResponse]:
        body, headers = await answer(gateway, data)
        return Response(body, headers=headers)  # type: ignore[arg-type]


class ClassifyController(Controller):
    path = "/v1/classify"
    tags = ["Encoder tasks"]

    @post(
        status_code=200, summary="Classify texts (sequence classification)", responses=WORK_ERRORS
    )
    async def create(
        self, data: ClassifyRequest, gateway: GatewayDep
    ) -> Response[ClassifyResponse]:
        body, headers = await answer(gateway, data)
        return Response(body, headers=headers)  # type: ignore[arg-type]
