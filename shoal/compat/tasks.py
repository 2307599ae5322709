"""Shoal's encoder-task routes beyond embeddings: NER, multi-vector, rerank, classify.

Schemas for the JSON routes (and, encoded as msgpack, the native ones), their split into
work items, and their results merged back in input order.

- NER: `POST /v1/ner`, entities per text with character offsets into that text.
- Multi-vector (late interaction, ColBERT-style): `POST /v1/multivector`, a tokens x dims
  matrix per text.
- Rerank: `POST /v1/rerank` (and `/rerank`), in the request shape Cohere, Jina, TEI and
  Infinity clients send: `query`, `documents` (strings or `{"text": ...}`; TEI's `texts`
  also works), `top_n`, `return_documents`; results sorted by relevance.
- Classify: `POST /v1/classify`, labels with scores per text, best first.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal

import msgspec
import numpy as np

from ..config import GatewaySettings
from ..queue.messages import (
    ClassifyJob,
    ClassifyResult,
    MultiVectorJob,
    MultiVectorResult,
    NerJob,
    NerResult,
    RerankJob,
    ScoresResult,
)
from ._constraints import Count, ModelName
from .errors import InvalidRequestError
from .extensions import ShoalOptions
from .jobs import (
    RESULT_BYTES_PER_ITEM,
    Envelope,
    check_count,
    check_texts,
    split_points,
    text_parts,
)

__all__ = [
    "ClassifyRequest",
    "ClassifyResponse",
    "MultiVectorRequest",
    "MultiVectorResponse",
    "NativeMultiVectorRequest",
    "NativeMultiVectorResponse",
    "NativeNerRequest",
    "NerRequest",
    "NerResponse",
    "RerankRequest",
    "RerankResponse",
    "Usage",
]

Aggregation = Literal["none", "simple", "first", "max", "average"]
Score = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class Usage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, results: Sequence) -> Usage:
        tokens = sum(r.prompt_tokens for r in results)
        return cls(tokens, tokens)


def _texts(value: str | list[str], param: str = "input") -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise InvalidRequestError(f"'{param}' must not be empty", param=param)
    return texts


def _checked(texts: list[str], limits: GatewaySettings, param: str) -> list[str]:
    """`texts`, within the gateway's limits on their count and length."""
    check_count(len(texts), limits, param)
    check_texts(texts, limits, param)
    return texts


# NER -----------------------------------------------------------------------------------


class NerRequest(msgspec.Struct, kw_only=True):
    input_param: ClassVar[str] = "input"
    """The field holding the texts, for errors."""

    model: ModelName
    input: str | list[str]
    aggregation: Aggregation = "simple"
    """As transformers' token-classification pipeline's `aggregation_strategy`."""
    labels: list[str] | None = None
    """Keep only entities with these labels."""
    threshold: Score = 0.0
    """Drop entities scoring below this."""
    shoal: ShoalOptions | None = None
    """Shoal extensions: `{"adapter": NAME}` picks a LoRA adapter of the model."""

    def texts(self) -> list[str]:
        return _texts(self.input)

    def to_jobs(self, env: Envelope, limits: GatewaySettings) -> list[NerJob]:
        texts = _checked(self.texts(), limits, self.input_param)
        return [
            NerJob(
                **env.job_fields(part, start),
                texts=texts[start:stop],
                aggregation=self.aggregation,
                labels=self.labels or [],
                threshold=self.threshold,
            )
            for part, (start, stop) in enumerate(text_parts(texts, limits))
        ]


class NativeNerRequest(NerRequest, kw_only=True):
    """The native route's body: `inputs` instead of `input`, otherwise the same."""

    input_param: ClassVar[str] = "inputs"
    input: str | list[str] = ""
    inputs: list[str] = []

    def texts(self) -> list[str]:
        return _texts(self.inputs, "inputs")


class NerEntity(msgspec.Struct):
    label: str
    text: str
    start: int
    end: int
    score: float


class NerData(msgspec.Struct):
    index: int
    entities: list[NerEntity]
    object: Literal["ner"] = "ner"


class NerResponse(msgspec.Struct):
    data: list[NerData]
    model: str
    usage: Usage
    object: Literal["list"] = "list"

    @classmethod
    def from_results(cls, texts: list[str], results: Sequence[NerResult], model: str):
        found = [entities for r in results for entities in r.entities]
        data = [
            NerData(
                i,
                [
                    NerEntity(e.label, text[e.start : e.end], e.start, e.end, e.score)
                    for e in entities
                ],
            )
            for i, (text, entities) in enumerate(zip(texts, found, strict=True))
        ]
        return cls(data=data, model=model, usage=Usage.of(results))


# Multi-vector --------------------------------------------------------------------------


class _MultiVectorOptions(msgspec.Struct, kw_only=True):
    normalize: bool = True
    skip_special: bool = True
    """Leave out the special tokens ([CLS], [SEP], ...)."""
    skip_punctuation: bool = False
    """Leave out punctuation tokens (as ColBERT does for documents)."""
    truncate: bool = True


class MultiVectorRequest(_MultiVectorOptions, kw_only=True):
    input_param: ClassVar[str] = "input"
    """The field holding the texts, for errors."""

    model: ModelName
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = "float"
    shoal: ShoalOptions | None = None
    """Shoal extensions: `{"adapter": NAME}` picks a LoRA adapter of the model."""

    def texts(self) -> list[str]:
        return _texts(self.input)

    def to_jobs(
        self,
        env: Envelope,
        limits: GatewaySettings,
        dims: int,
        max_length: int,
        dtype: str = "float32",
    ) -> list[MultiVectorJob]:
        texts = _checked(self.texts(), limits, self.input_param)
        # A reply holds one row per token. A token covers at least one UTF-8 byte, so a
        # text has at most bytes + a few special tokens, and never more than max_length.
        row_bytes = dims * (2 if dtype == "float16" else 4)
        bounds = [row_bytes * min(max_length, len(t.encode()) + 4) for t in texts]
        parts = split_points(bounds, limits.item_max_inputs, RESULT_BYTES_PER_ITEM, 0)
        return [
            MultiVectorJob(
                **env.job_fields(part, start),
                texts=texts[start:stop],
                normalize=self.normalize,
                skip_special=self.skip_special,
                skip_punctuation=self.skip_punctuation,
                truncate=self.truncate,
                dtype=dtype,
            )  # type: ignore[arg-type]
            for part, (start, stop) in enumerate(parts)
        ]


class NativeMultiVectorRequest(MultiVectorRequest, kw_only=True):
    input_param: ClassVar[str] = "inputs"
    input: str | list[str] = ""
    inputs: list[str] = []
    dtype: Literal["float32", "float16"] = "float32"

    def texts(self) -> list[str]:
        return _texts(self.inputs, "inputs")


class MultiVectorData(msgspec.Struct):
    index: int
    embeddings: list[list[float]] | str
    """Rows of floats, or (base64) the matrix's little-endian float32 bytes."""
    tokens: int
    object: Literal["multivector"] = "multivector"


def _joined(results: Sequence[MultiVectorResult]) -> tuple[bytes, list[int]]:
    data = b"".join(r.data for r in results)
    counts = [c for r in results for c in r.counts]
    return data, counts


class MultiVectorResponse(msgspec.Struct):
    data: list[MultiVectorData]
    model: str
    dims: int
    usage: Usage
    object: Literal["list"] = "list"

    @classmethod
    def from_results(cls, results: Sequence[MultiVectorResult], model: str, encoding_format: str):
        data, counts = _joined(results)
        dims = results[0].dims
        matrix = np.frombuffer(data, dtype="<f4").reshape(-1, dims)
        items = []
        row = 0
        for i, count in enumerate(counts):
            block = matrix[row : row + count]
            row += count
            value = (
                base64.b64encode(block.tobytes()).decode()
                if encoding_format == "base64"
                else block.tolist()
            )
            items.append(MultiVectorData(i, value, count))
        return cls(data=items, model=model, dims=dims, usage=Usage.of(results))


class NativeMultiVectorResponse(msgspec.Struct):
    """All texts' token vectors in one buffer: text i is rows `offsets[i]:offsets[i+1]`."""

    model: str
    data: bytes
    offsets: list[int]
    dims: int
    dtype: Literal["float32", "float16"]
    usage: Usage

    @classmethod
    def from_results(cls, results: Sequence[MultiVectorResult], model: str):
        data, counts = _joined(results)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int).tolist()
        return cls(
            model=model,
            data=data,
            offsets=offsets,
            dims=results[0].dims,
            dtype=results[0].dtype,
            usage=Usage.of(results),
        )


# Rerank ----------------------------------------------------------------------------------


class RerankDocument(msgspec.Struct):
    text: str


class RerankRequest(msgspec.Struct, kw_only=True):
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

    def to_jobs(self, env: Envelope, limits: GatewaySettings) -> list[RerankJob]:
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


# Classify --------------------------------------------------------------------------------


class ClassifyRequest(msgspec.Struct, kw_only=True):
    model: ModelName
    input: str | list[str]
    top_k: Count | None = None
    """Labels per text, best first; all of them when absent."""
    truncate: bool = True
    shoal: ShoalOptions | None = None
    """Shoal extensions: `{"adapter": NAME}` picks a LoRA adapter of the model."""

    def to_jobs(self, env: Envelope, limits: GatewaySettings) -> list[ClassifyJob]:
        texts = _checked(_texts(self.input), limits, "input")
        return [
            ClassifyJob(
                **env.job_fields(part, start),
                texts=texts[start:stop],
                top_k=self.top_k or 0,
                truncate=self.truncate,
            )
            for part, (start, stop) in enumerate(text_parts(texts, limits))
        ]


class ClassLabel(msgspec.Struct):
    label: str
    score: float


class ClassifyData(msgspec.Struct):
    index: int
    labels: list[ClassLabel]
    object: Literal["classification"] = "classification"


class ClassifyResponse(msgspec.Struct):
    data: list[ClassifyData]
    model: str
    usage: Usage
    object: Literal["list"] = "list"

    @classmethod
    def from_results(cls, results: Sequence[ClassifyResult], model: str):
        rows = [labels for r in results for labels in r.labels]
        data = [
            ClassifyData(i, [ClassLabel(x.label, x.score) for x in labels])
            for i, labels in enumerate(rows)
        ]
        return cls(data=data, model=model, usage=Usage.of(results))
