"""Encoder-task routes beyond embeddings: NER, multi-vector, rerank, classify (JSON)."""

from __future__ import annotations

from litestar import Controller, post

from ...compat.tasks import (
    ClassifyRequest,
    ClassifyResponse,
    MultiVectorRequest,
    MultiVectorResponse,
    NerRequest,
    NerResponse,
    RerankRequest,
    RerankResponse,
)
from .. import endpoints
from ..runtime import RuntimeDep
from ._openapi import WORK_ERRORS

__all__ = ["ClassifyController", "MultiVectorController", "NerController", "RerankController"]


class NerController(Controller):
    path = "/v1/ner"
    tags = ["Encoder tasks"]

    @post(status_code=200, summary="Named entities (token classification)", responses=WORK_ERRORS)
    async def create(self, data: NerRequest, runtime: RuntimeDep) -> NerResponse:
        return await endpoints.ner(runtime, data)


class MultiVectorController(Controller):
    path = "/v1/multivector"
    tags = ["Encoder tasks"]

    @post(
        status_code=200,
        summary="Token vectors (late interaction, ColBERT-style)",
        responses=WORK_ERRORS,
    )
    async def create(self, data: MultiVectorRequest, runtime: RuntimeDep) -> MultiVectorResponse:
        return await endpoints.multivector(runtime, data)


class RerankController(Controller):
    path = "/"
    tags = ["Encoder tasks"]

    @post(
        ["/v1/rerank", "/rerank"],
        status_code=200,
        summary="Rerank documents for a query",
        responses=WORK_ERRORS,
    )
    async def create(self, data: RerankRequest, runtime: RuntimeDep) -> RerankResponse:
        return await endpoints.rerank(runtime, data)


class ClassifyController(Controller):
    path = "/v1/classify"
    tags = ["Encoder tasks"]

    @post(
        status_code=200, summary="Classify texts (sequence classification)", responses=WORK_ERRORS
    )
    async def create(self, data: ClassifyRequest, runtime: RuntimeDep) -> ClassifyResponse:
        return await endpoints.classify(runtime, data)
