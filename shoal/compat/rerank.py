"""Rerank: `POST /v1/rerank` (and `/rerank`), in the request shape Cohere's v1, Jina, TEI
and Infinity clients send: `query`, `documents` (strings or `{"text": ...}`; TEI's `texts`
also works), `top_n`, `return_documents`; results sorted by relevance. `POST /v2/rerank`
is Cohere's v2 shape (`cohere.ClientV2().rerank`): strings only, `max_tokens_per_doc`,
and `meta` with billed search units. Both run the same cross-encoder jobs (`rerank_jobs`).
"""

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
from .jobs import Envelope, InputUsage, check_count, check_texts, text_parts

__all__ = [
    "CohereRerankRequest",
    "CohereRerankResponse",
    "RerankDocument",
    "RerankRequest",
    "RerankResponse",
    "RerankResult",
    "rerank_jobs",
]

DOCUMENTS_PER_SEARCH_UNIT = 100
"""Cohere bills one search unit per query with up to 100 documents."""


def rerank_jobs(
    env: Envelope,
    query: str,
    docs: list[str],
    limits: GatewaySettings,
    *,
    truncate: bool = True,
    doc_tokens: int = 0,
    first_part: int = 0,
    first_index: int = 0,
) -> list[RerankJob]:
    """`query` against `docs`, cut into jobs by the gateway's item limits; parts and result
    indexes numbered from `first_part` and `first_index` (a request of several queries)."""
    check_texts([query], limits, "query")
    check_texts(docs, limits, "documents", already=len(query))
    return [
        RerankJob(
            **env.job_fields(first_part + part, first_index + start),
            query=query,
            documents=docs[start:stop],
            truncate=truncate,
            doc_tokens=doc_tokens,
        )
        for part, (start, stop) in enumerate(text_parts(docs, limits))
    ]


def ranked(scores: np.ndarray, top_n: int | None) -> np.ndarray:
    """Indexes of `scores`, best first (ties in input order), the first `top_n`."""
    return np.argsort(-scores, kind="stable")[:top_n]


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
        return rerank_jobs(env, self.query, docs, limits, truncate=self.truncate)

    def respond(self, results: Sequence[ScoresResult], model: str) -> RerankResponse:
        return RerankResponse.from_results(self, self.document_texts(), results, model)


class RerankResult(msgspec.Struct, omit_defaults=True):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankResponse(msgspec.Struct):
    results: list[RerankResult]
    model: str
    usage: InputUsage
    object: Literal["rerank"] = "rerank"

    @classmethod
    def from_results(
        cls, request: RerankRequest, docs: list[str], results: Sequence[ScoresResult], model: str
    ):
        scores = np.array([s for r in results for s in r.scores])
        ranked_docs = [
            RerankResult(
                int(i),
                float(scores[i]),
                RerankDocument(docs[i]) if request.return_documents else None,
            )
            for i in ranked(scores, request.top_n)
        ]
        return cls(results=ranked_docs, model=model, usage=InputUsage.of(results))


class CohereRerankRequest(msgspec.Struct, kw_only=True):
    """`POST /v2/rerank`'s body, as Cohere's v2 API and `cohere.ClientV2` send it."""

    op: ClassVar[Task] = "rerank"

    model: ModelName
    query: str
    documents: list[str]
    top_n: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_tokens_per_doc: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Each document is cut to this many tokens (Cohere's default, 4096, is above every
    model's length limit here: then only the model's limit cuts)."""
    priority: int | None = None
    """Accepted for compatibility; live requests are served in arrival order."""
    relevant_spans: dict | None = None
    """Refused when enabled: no model served here reports spans."""
    shoal: ShoalOptions | None = None

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[RerankJob]:
        if self.relevant_spans and self.relevant_spans.get("mode") == "enabled":
            raise InvalidRequestError(
                "relevant_spans is not supported: the served models do not report spans",
                param="relevant_spans",
            )
        if not self.query.strip():
            raise InvalidRequestError("'query' must not be empty", param="query")
        check_count(len(self.documents), limits, "documents")
        # A cut at or past the model's limit cuts nothing more (and keeps any huge value
        # off the wire).
        cut = self.max_tokens_per_doc or 0
        return rerank_jobs(
            env, self.query, self.documents, limits, doc_tokens=cut if cut < spec.max_length else 0
        )

    def respond(self, results: Sequence[ScoresResult], model: str) -> CohereRerankResponse:
        scores = np.array([s for r in results for s in r.scores])
        units = -(-len(self.documents) // DOCUMENTS_PER_SEARCH_UNIT)
        tokens = InputUsage.of(results).prompt_tokens
        return CohereRerankResponse(
            id=results[0].request_id if results else "",
            results=[
                CohereRerankResult(int(i), float(scores[i])) for i in ranked(scores, self.top_n)
            ],
            meta=CohereMeta(
                billed_units=CohereBilledUnits(search_units=units),
                tokens=CohereTokens(input_tokens=tokens),
            ),
        )


class CohereRerankResult(msgspec.Struct):
    index: int
    relevance_score: float


class CohereApiVersion(msgspec.Struct):
    version: str = "2"


class CohereBilledUnits(msgspec.Struct):
    search_units: int


class CohereTokens(msgspec.Struct):
    input_tokens: int
    output_tokens: int = 0


class CohereMeta(msgspec.Struct):
    billed_units: CohereBilledUnits
    tokens: CohereTokens
    api_version: CohereApiVersion = msgspec.field(default_factory=CohereApiVersion)


class CohereRerankResponse(msgspec.Struct):
    id: str
    results: list[CohereRerankResult]
    meta: CohereMeta
