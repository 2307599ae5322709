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
from ..runtime import RuntimeDep

__all__ = ["ClassifyController", "MultiVectorController", "NerController", "RerankController"]


class NerController(Controller):
    path = "/v1/ner"
    tags = ["Encoder tasks"]

    @post(status_code=200, summary="Named entities (token classification)")
    async def create(self, data: NerRequest, runtime: RuntimeDep) -> NerResponse:
        target = runtime.resolve(data.model, "ner", data.shoal)
        texts = data.texts()
        limits = runtime.settings.gateway
        results = await runtime.run(target, lambda env: data.to_jobs(env, limits))
        return NerResponse.from_results(texts, results, target.name)


class MultiVectorController(Controller):
    path = "/v1/multivector"
    tags = ["Encoder tasks"]

    @post(status_code=200, summary="Token vectors (late interaction, ColBERT-style)")
    async def create(self, data: MultiVectorRequest, runtime: RuntimeDep) -> MultiVectorResponse:
        target = runtime.resolve(data.model, "multivector", data.shoal)
        dims = target.spec.multivector.dims or target.spec.dims
        limits = runtime.settings.gateway
        results = await runtime.run(
            target, lambda env: data.to_jobs(env, limits, dims, target.spec.max_length)
        )
        return MultiVectorResponse.from_results(results, target.name, data.encoding_format)


class RerankController(Controller):
    path = "/"
    tags = ["Encoder tasks"]

    @post(["/v1/rerank", "/rerank"], status_code=200, summary="Rerank documents for a query")
    async def create(self, data: RerankRequest, runtime: RuntimeDep) -> RerankResponse:
        target = runtime.resolve(data.model, "rerank", data.shoal)
        docs = data.document_texts()
        limits = runtime.settings.gateway
        results = await runtime.run(target, lambda env: data.to_jobs(env, limits))
        return RerankResponse.from_results(data, docs, results, target.name)


class ClassifyController(Controller):
    path = "/v1/classify"
    tags = ["Encoder tasks"]

    @post(status_code=200, summary="Classify texts (sequence classification)")
    async def create(self, data: ClassifyRequest, runtime: RuntimeDep) -> ClassifyResponse:
        target = runtime.resolve(data.model, "classify", data.shoal)
        limits = runtime.settings.gateway
        results = await runtime.run(target, lambda env: data.to_jobs(env, limits))
        return ClassifyResponse.from_results(results, target.name)
