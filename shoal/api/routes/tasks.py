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
        spec = runtime.resolve(data.model, "ner")
        texts = data.texts()
        limits = runtime.settings.gateway
        results = await runtime.run(spec, lambda env: data.to_jobs(env, limits))
        return NerResponse.from_results(texts, results, spec.id)


class MultiVectorController(Controller):
    path = "/v1/multivector"
    tags = ["Encoder tasks"]

    @post(status_code=200, summary="Token vectors (late interaction, ColBERT-style)")
    async def create(self, data: MultiVectorRequest, runtime: RuntimeDep) -> MultiVectorResponse:
        spec = runtime.resolve(data.model, "multivector")
        dims = spec.multivector.dims or spec.dims
        limits = runtime.settings.gateway
        results = await runtime.run(
            spec, lambda env: data.to_jobs(env, limits, dims, spec.max_length)
        )
        return MultiVectorResponse.from_results(results, spec.id, data.encoding_format)


class RerankController(Controller):
    path = "/"
    tags = ["Encoder tasks"]

    @post(["/v1/rerank", "/rerank"], status_code=200, summary="Rerank documents for a query")
    async def create(self, data: RerankRequest, runtime: RuntimeDep) -> RerankResponse:
        spec = runtime.resolve(data.model, "rerank")
        docs = data.document_texts()
        limits = runtime.settings.gateway
        results = await runtime.run(spec, lambda env: data.to_jobs(env, limits))
        return RerankResponse.from_results(data, docs, results, spec.id)


class ClassifyController(Controller):
    path = "/v1/classify"
    tags = ["Encoder tasks"]

    @post(status_code=200, summary="Classify texts (sequence classification)")
    async def create(self, data: ClassifyRequest, runtime: RuntimeDep) -> ClassifyResponse:
        spec = runtime.resolve(data.model, "classify")
        limits = runtime.settings.gateway
        results = await runtime.run(spec, lambda env: data.to_jobs(env, limits))
        return ClassifyResponse.from_results(results, spec.id)
