"""Every route group in one table: the paths it covers, whether its requests wait on
workers, and each endpoint that runs inputs on workers: its paths, request and response,
whether it streams and whether a Batches API line may name it.

The routes that run work (routes/work.py), key rights (`keys.ROUTE_GROUPS`), admission
(`route_group`, which groups the in-flight bound and tokens per minute count) and the
Batches API's endpoints (`answer.BATCH_ENDPOINTS`) derive from it, so adding a task is a
row here and its compat module (the request, the response, the op it becomes).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from ..compat.classify import ClassifyRequest, ClassifyResponse
from ..compat.cohere_embed import CohereEmbedRequest, CohereEmbedResponse
from ..compat.multivector import MultiVectorRequest, MultiVectorResponse
from ..compat.ner import NerRequest, NerResponse
from ..compat.openai import EmbeddingRequest, EmbeddingResponse
from ..compat.openai.chat import ChatCompletion, ChatCompletionRequest
from ..compat.openai.completions import Completion, CompletionRequest
from ..compat.openai.responses import Response, ResponseRequest
from ..compat.rerank import (
    CohereRerankRequest,
    CohereRerankResponse,
    RerankRequest,
    RerankResponse,
)
from ..compat.score import ScoreRequest, ScoreResponse
from ..compat.sparse import SparseRequest, SparseResponse
from ..compat.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)

__all__ = [
    "ENDPOINTS",
    "GROUPS",
    "ROUTE_GROUPS",
    "WORK_GROUPS",
    "Endpoint",
    "RouteGroup",
    "batchable",
    "route_group",
]

OPENAI, TASKS = "OpenAI", "Encoder tasks"
"""The docs' sections (OpenAPI tags)."""


@dataclass(frozen=True)
class Endpoint:
    """A POST route whose body becomes work for the workers."""

    paths: tuple[str, ...]
    """Its paths; a Batches API line names the first."""
    request: type[msgspec.Struct]
    response: type[msgspec.Struct]
    """What it answers as JSON (a stream's chunks are the compat module's)."""
    summary: str
    tag: str = TASKS
    streams: bool = False
    """Answers as server-sent events when the request's `stream` is true."""
    batchable: bool = True


@dataclass(frozen=True)
class RouteGroup:
    """Routes a key's `routes` names as one right."""

    name: str
    endpoints: tuple[Endpoint, ...] = ()
    prefixes: tuple[str, ...] = ()
    """Path prefixes of its other routes (those not in `endpoints`)."""
    works: bool = True
    """Its requests wait on workers: the in-flight bound and tokens per minute count them."""

    @property
    def all_prefixes(self) -> tuple[str, ...]:
        return tuple(path for e in self.endpoints for path in e.paths) + self.prefixes


def _one(name: str, endpoint: Endpoint) -> RouteGroup:
    return RouteGroup(name, (endpoint,))


GROUPS: tuple[RouteGroup, ...] = (
    RouteGroup(
        "embeddings",
        (
            Endpoint(
                ("/v1/embeddings",),
                EmbeddingRequest,
                EmbeddingResponse,
                "Create embeddings",
                OPENAI,
            ),
            Endpoint(
                ("/v2/embed",),
                CohereEmbedRequest,
                CohereEmbedResponse,
                "Embed texts (Cohere's v2 shape; float, int8, uint8, binary, ubinary)",
            ),
        ),
    ),
    RouteGroup(
        "chat",
        prefixes=("/v1/chat/",),
        endpoints=(
            Endpoint(
                ("/v1/chat/completions",),
                ChatCompletionRequest,
                ChatCompletion,
                "Create a chat completion (SSE when stream is true)",
                OPENAI,
                streams=True,
            ),
        ),
    ),
    _one(
        "completions",
        Endpoint(
            ("/v1/completions",),
            CompletionRequest,
            Completion,
            "Create a completion (SSE when stream is true)",
            OPENAI,
            streams=True,
        ),
    ),
    _one(
        "responses",
        Endpoint(
            ("/v1/responses",),
            ResponseRequest,
            Response,
            "Create a model response (Responses API; SSE when stream is true)",
            OPENAI,
            streams=True,
        ),
    ),
    RouteGroup("models", prefixes=("/v1/models",), works=False),
    RouteGroup("files", prefixes=("/v1/files",), works=False),
    RouteGroup("batches", prefixes=("/v1/batches",), works=False),
    RouteGroup("native", prefixes=("/native/",)),
    RouteGroup("tei", prefixes=("/tei/",)),  # TEI's routes under a model's base URL
    _one(
        "ner",
        Endpoint(("/v1/ner",), NerRequest, NerResponse, "Named entities (token classification)"),
    ),
    _one(
        "multivector",
        Endpoint(
            ("/v1/multivector",),
            MultiVectorRequest,
            MultiVectorResponse,
            "Token vectors (late interaction, ColBERT-style)",
        ),
    ),
    RouteGroup(
        "rerank",
        (
            Endpoint(
                ("/v1/rerank", "/rerank"),
                RerankRequest,
                RerankResponse,
                "Rerank documents for a query (Cohere v1, Jina and TEI shape)",
            ),
            Endpoint(
                ("/v2/rerank",),
                CohereRerankRequest,
                CohereRerankResponse,
                "Rerank documents for a query (Cohere's v2 shape)",
            ),
            Endpoint(
                ("/v1/score", "/score"),
                ScoreRequest,
                ScoreResponse,
                "Relevance of text pairs (vLLM's score shape)",
            ),
        ),
    ),
    _one(
        "classify",
        Endpoint(
            ("/v1/classify",),
            ClassifyRequest,
            ClassifyResponse,
            "Classify texts (sequence classification)",
        ),
    ),
    _one(
        "sparse",
        Endpoint(
            ("/v1/sparse",),
            SparseRequest,
            SparseResponse,
            "Sparse (SPLADE) embeddings: nonzero vocabulary weights per text",
        ),
    ),
    RouteGroup(
        "tokenize",
        (
            Endpoint(
                ("/tokenize",),
                TokenizeRequest,
                TokenizeResponse,
                "A prompt's or a chat's tokens, any model (vLLM's shape)",
                batchable=False,
            ),
            Endpoint(
                ("/detokenize",),
                DetokenizeRequest,
                DetokenizeResponse,
                "Token ids back to text, any model (vLLM's shape)",
                batchable=False,
            ),
        ),
    ),
    RouteGroup("admin", prefixes=("/admin/",), works=False),
)

ENDPOINTS: tuple[Endpoint, ...] = tuple(e for g in GROUPS for e in g.endpoints)
ROUTE_GROUPS = tuple(g.name for g in GROUPS if g.name != "admin")
"""The route groups a key's `routes` may name; `admin` is granted by `admin = true`."""
WORK_GROUPS = frozenset(g.name for g in GROUPS if g.works)
"""Groups whose requests wait on workers: the ones the in-flight bound counts."""

# Longest first, so that a prefix inside another never takes its paths.
_PREFIXES = sorted(
    ((prefix, g.name) for g in GROUPS for prefix in g.all_prefixes), key=lambda p: -len(p[0])
)


def route_group(path: str) -> str | None:
    """The route group a path belongs to; None for public routes (health, docs)."""
    for prefix, group in _PREFIXES:
        if path.startswith(prefix):
            return group
    return None


def batchable() -> dict[str, type[msgspec.Struct]]:
    """Every path a Batches API line may name, with the request its body decodes."""
    return {e.paths[0]: e.request for e in ENDPOINTS if e.batchable}
