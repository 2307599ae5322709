"""Every route group in one table: the paths it covers, whether its requests wait on
workers, and, for each path a Batches API line may name, the request that line decodes.

Key rights (`keys.ROUTE_GROUPS`), admission (`route_group`, which groups the in-flight
bound and tokens per minute count) and the Batches API's endpoints (`answer.BATCH_ENDPOINTS`)
derive from it, so adding a task is a row here, its compat module and its controller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from ..compat.classify import ClassifyRequest
from ..compat.multivector import MultiVectorRequest
from ..compat.ner import NerRequest
from ..compat.openai import EmbeddingRequest
from ..compat.openai.chat import ChatCompletionRequest
from ..compat.openai.completions import CompletionRequest
from ..compat.openai.responses import ResponseRequest
from ..compat.rerank import CohereRerankRequest, RerankRequest
from ..compat.score import ScoreRequest
from ..compat.sparse import SparseRequest

__all__ = ["GROUPS", "ROUTE_GROUPS", "WORK_GROUPS", "RouteGroup", "batchable", "route_group"]


@dataclass(frozen=True)
class RouteGroup:
    """Routes a key's `routes` names as one right."""

    name: str
    prefixes: tuple[str, ...]
    """Path prefixes of its routes."""
    works: bool = True
    """Its requests wait on workers: the in-flight bound and tokens per minute count them."""
    batch: dict[str, type[msgspec.Struct]] = field(default_factory=dict)
    """Its paths a Batches API line may name, each with the request its body decodes."""


GROUPS: tuple[RouteGroup, ...] = (
    RouteGroup("embeddings", ("/v1/embeddings",), batch={"/v1/embeddings": EmbeddingRequest}),
    RouteGroup("chat", ("/v1/chat/",), batch={"/v1/chat/completions": ChatCompletionRequest}),
    RouteGroup("completions", ("/v1/completions",), batch={"/v1/completions": CompletionRequest}),
    RouteGroup("responses", ("/v1/responses",), batch={"/v1/responses": ResponseRequest}),
    RouteGroup("models", ("/v1/models",), works=False),
    RouteGroup("files", ("/v1/files",), works=False),
    RouteGroup("batches", ("/v1/batches",), works=False),
    RouteGroup("native", ("/native/",)),
    RouteGroup("ner", ("/v1/ner",), batch={"/v1/ner": NerRequest}),
    RouteGroup("multivector", ("/v1/multivector",), batch={"/v1/multivector": MultiVectorRequest}),
    RouteGroup(
        "rerank",
        ("/v1/rerank", "/v2/rerank", "/rerank", "/v1/score", "/score"),
        batch={
            "/v1/rerank": RerankRequest,
            "/v2/rerank": CohereRerankRequest,
            "/v1/score": ScoreRequest,
        },
    ),
    RouteGroup("classify", ("/v1/classify",), batch={"/v1/classify": ClassifyRequest}),
    RouteGroup("sparse", ("/v1/sparse",), batch={"/v1/sparse": SparseRequest}),
    RouteGroup("admin", ("/admin/",), works=False),
)

ROUTE_GROUPS = tuple(g.name for g in GROUPS if g.name != "admin")
"""The route groups a key's `routes` may name; `admin` is granted by `admin = true`."""
WORK_GROUPS = frozenset(g.name for g in GROUPS if g.works)
"""Groups whose requests wait on workers: the ones the in-flight bound counts."""

# Longest first, so that a prefix inside another never takes its paths.
_PREFIXES = sorted(
    ((prefix, g.name) for g in GROUPS for prefix in g.prefixes), key=lambda p: -len(p[0])
)


def route_group(path: str) -> str | None:
    """The route group a path belongs to; None for public routes (health, docs)."""
    for prefix, group in _PREFIXES:
        if path.startswith(prefix):
            return group
    return None


def batchable() -> dict[str, type[msgspec.Struct]]:
    """Every path a Batches API line may name, with the request its body decodes."""
    return {path: request for g in GROUPS for path, request in g.batch.items()}
