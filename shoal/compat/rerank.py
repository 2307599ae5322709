"""Rerank: `POST /v1/rerank` (and `/rerank`), in the request shape Cohere, Jina, TEI and
Infinity clients send: `query`, `documents` (strings or `{"text": ...}`; TEI's `texts`
also works), `top_n`, `return_documents`; results sorted by relevance."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal

import msgspec
import numpy as np

from ..config import GatewaySettings
from ..model_registry import ModelSpec
from ..queue.messages import RerankJob, ScoresResult
from ..queue.subjects import Task
from ._constraints import ModelName
from .errors import InvalidRequestError
from .extensions import ShoalOptions
from .jobs import Envelope, Usage, check_count, check_texts, text_parts

__all__ = ["RerankDocument", "RerankRequest", "RerankResponse", "RerankResult"]


class RerankDocument(msgspec.Struct):
    text: str


class RerankRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/rerank`'s body (Cohere, Jina and TEI clients' shape)."""

    op: ClassVar[Task] = "rerank"

    model: ModelName
    query: str
    documents: list[str | RerankDocument] | None = None
    texts: list[str] | None = None
    """TEI's name for `documents`."""
    top_n: Annotated[int, msgspec.Meta(ge=1)] | None = None
    return_documents: bool = False
    truncate: bool = True
    shoal: ShoalOptions | None = None
    """Shoal extensions: `{"adapter": NAME}` picks a LoRA adapter of the model."""

    def document_texts(self) -> list[str]:
        if self.documents is not None and self.texts is not None:
            raise InvalidRequestError("send 'documents' or 'texts', not both", param="documents")
        docs = self.documents if self.documents is not None else self.texts
        if not docs:
            raise InvalidRequestError("'documents' must not be empty", param="documents")
        if not self.query.strip():
            raise InvalidRequestError("'query' must not be empty", param="query")
        return [d if isinstance(d, str) else d.text for d in docs]

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[RerankJob]:
        docs = self.document_texts()
        check_count(len(docs), limits, "documents")
        check_texts([self.query], limits, "query")
        check_texts(docs, limits, "documents", already=len(self.query))
        return [
            RerankJob(
                **env.job_fields(part, start),
                query=self.query,
                documents=docs[start:stop],
                truncate=self.truncate,
            )
            for part, (start, stop) in enumerate(text_parts(docs, limits))
        ]

    def respond(self, results: Sequence[ScoresResult], model: str) -> RerankResponse:
        return RerankResponse.from_results(self, self.document_texts(), results, model)


class RerankResult(msgspec.Struct, omit_defaults=True):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankResponse(msgspec.Struct):
    results: list[RerankResult]
    model: str
    usage: Usage
    object: Literal["rerank"] = "rerank"

    @classmethod
    def from_results(
        cls, request: RerankRequest, docs: list[str], results: Sequence[ScoresResult], model: str
    ):
        scores = np.array([s for r in results for s in r.scores])
        order = np.argsort(-scores, kind="stable")[: request.top_n]
        ranked = [
            RerankResult(
                int(i),
                float(scores[i]),
                RerankDocument(docs[i]) if request.return_documents else None,
            )
            for i in order
        ]
        return cls(results=ranked, model=model, usage=Usage.of(results))
