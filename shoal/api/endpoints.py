"""What each OpenAI-style POST route does with a decoded body, without HTTP.

The routes and the batch runner call the same functions, so a line of a batch is
answered exactly as the same request sent live (the batch runner passes a runtime on
the batch lane).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import msgspec

from ..compat.embed import Vectors
from ..compat.openai import EmbeddingRequest, EmbeddingResponse
from ..compat.openai.chat import ChatCompletion, ChatCompletionRequest
from ..compat.openai.completions import Completion, CompletionRequest
from ..compat.openai.generation import Usage
from ..compat.tasks import (
    ClassifyRequest,
    ClassifyResponse,
    MultiVectorRequest,
    MultiVectorResponse,
    NerRequest,
    NerResponse,
    RerankRequest,
    RerankResponse,
)
from .generation import Generation
from .runtime import Runtime, Target

__all__ = [
    "BATCH_ENDPOINTS",
    "Endpoint",
    "classify",
    "embeddings",
    "multivector",
    "ner",
    "rerank",
    "start_chat",
    "start_completion",
]


async def embeddings(runtime: Runtime, data: EmbeddingRequest) -> tuple[EmbeddingResponse, Vectors]:
    target = runtime.resolve(data.model, "embed", data.shoal)
    texts, token_ids = data.inputs()
    vectors = await runtime.embed(target, data.options(), texts=texts, token_ids=token_ids)
    return EmbeddingResponse.from_vectors(vectors, target.name, data.encoding_format), vectors


def start_chat(runtime: Runtime, data: ChatCompletionRequest) -> tuple[Generation, Target]:
    target = runtime.resolve(data.model, "generate", data.shoal)
    limits = runtime.settings.gateway
    jobs = runtime.prepare(target, lambda env: [data.to_job(env, target.spec.max_length, limits)])
    return Generation(runtime, jobs, target.name), target


async def chat(runtime: Runtime, data: ChatCompletionRequest) -> ChatCompletion:
    generation, target = start_chat(runtime, data)
    deltas = [d async for batch in generation for d in batch]
    usage = Usage.of(generation.prompt_tokens, generation.completion_tokens)
    return ChatCompletion.collect(
        f"chatcmpl-{secrets.token_hex(12)}", target.name, deltas, data.n, data.logprobs, usage
    )


def start_completion(runtime: Runtime, data: CompletionRequest) -> tuple[Generation, Target]:
    target = runtime.resolve(data.model, "generate", data.shoal)
    limits = runtime.settings.gateway
    jobs = runtime.prepare(target, lambda env: data.to_jobs(env, target.spec.max_length, limits))
    return Generation(runtime, jobs, target.name), target


async def completion(runtime: Runtime, data: CompletionRequest) -> Completion:
    generation, target = start_completion(runtime, data)
    deltas = [d async for batch in generation for d in batch]
    usage = Usage.of(generation.prompt_tokens, generation.completion_tokens)
    prompts = generation.prompts if data.echo else [""] * generation.choices
    return Completion.collect(
        f"cmpl-{secrets.token_hex(12)}",
        target.name,
        deltas,
        generation.choices,
        data.logprobs is not None,
        prompts,
        usage,
    )


async def ner(runtime: Runtime, data: NerRequest) -> NerResponse:
    target = runtime.resolve(data.model, "ner", data.shoal)
    texts = data.texts()
    limits = runtime.settings.gateway
    results = await runtime.run(target, lambda env: data.to_jobs(env, limits))
    return NerResponse.from_results(texts, results, target.name)


async def multivector(runtime: Runtime, data: MultiVectorRequest) -> MultiVectorResponse:
    target = runtime.resolve(data.model, "multivector", data.shoal)
    dims = target.spec.multivector.dims or target.spec.dims
    limits = runtime.settings.gateway
    results = await runtime.run(
        target, lambda env: data.to_jobs(env, limits, dims, target.spec.max_length)
    )
    return MultiVectorResponse.from_results(results, target.name, data.encoding_format)


async def rerank(runtime: Runtime, data: RerankRequest) -> RerankResponse:
    target = runtime.resolve(data.model, "rerank", data.shoal)
    docs = data.document_texts()
    limits = runtime.settings.gateway
    results = await runtime.run(target, lambda env: data.to_jobs(env, limits))
    return RerankResponse.from_results(data, docs, results, target.name)


async def classify(runtime: Runtime, data: ClassifyRequest) -> ClassifyResponse:
    target = runtime.resolve(data.model, "classify", data.shoal)
    limits = runtime.settings.gateway
    results = await runtime.run(target, lambda env: data.to_jobs(env, limits))
    return ClassifyResponse.from_results(results, target.name)


async def _embeddings_body(runtime: Runtime, data: EmbeddingRequest) -> EmbeddingResponse:
    return (await embeddings(runtime, data))[0]


class Endpoint(NamedTuple):
    """A route a batch may target: its body type, the task its model must serve, and
    what answers one body."""

    request: type[msgspec.Struct]
    op: str
    call: Callable[[Runtime, Any], Awaitable[msgspec.Struct]]
    streams: bool = False
    """Whether the body has a `stream` flag (refused in batches)."""


BATCH_ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": Endpoint(ChatCompletionRequest, "generate", chat, streams=True),
    "/v1/completions": Endpoint(CompletionRequest, "generate", completion, streams=True),
    "/v1/embeddings": Endpoint(EmbeddingRequest, "embed", _embeddings_body),
    "/v1/rerank": Endpoint(RerankRequest, "rerank", rerank),
    "/v1/ner": Endpoint(NerRequest, "ner", ner),
    "/v1/multivector": Endpoint(MultiVectorRequest, "multivector", multivector),
    "/v1/classify": Endpoint(ClassifyRequest, "classify", classify),
}
