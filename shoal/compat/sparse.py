"""Sparse embeddings: `POST /v1/sparse`, SPLADE-style vectors of a masked-LM model, for
hybrid (lexical + dense) search.

Each text's vector is over the model's vocabulary: log(1 + relu(logits)) max-pooled over
its tokens, and only the nonzero weights are sent, as two parallel arrays `indices`
(vocabulary ids, ascending) and `values`: the shape Qdrant, Milvus, Elasticsearch and
Pinecone take a sparse vector in. (TEI's `/embed_sparse` sends one `{index, value}` object
per weight, about 3x the bytes for the same vector; the arrays are what a client hands
its vector store.) `top_k` keeps the largest weights, `threshold` drops smaller ones.
`POST /native/v1/sparse` (msgpack, `inputs`) answers with two packed buffers for all
texts and their offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal

import msgspec
import numpy as np

from ..config import GatewaySettings
from ..model_registry import ModelSpec
from ..queue.messages import SparseJob, SparseResult
from ..queue.subjects import Task
from ._constraints import ModelName
from .extensions import ShoalOptions
from .jobs import Envelope, InputUsage, checked_texts, text_parts, texts_of

__all__ = [
    "NativeSparseRequest",
    "NativeSparseResponse",
    "SparseEmbedding",
    "SparseRequest",
    "SparseResponse",
    "unpack",
]


class SparseRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/sparse`'s body."""

    op: ClassVar[Task] = "sparse"
    input_param: ClassVar[str] = "input"

    model: ModelName
    input: str | list[str]
    top_k: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] | None = None
    """Keep at most this many weights per text, the largest; all nonzero ones when absent."""
    threshold: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    """Drop weights at or below this."""
    truncate: bool = True
    shoal: ShoalOptions | None = None

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[SparseJob]:
        texts = checked_texts(self.texts(), limits, self.input_param)
        return [
            SparseJob(
                **env.job_fields(part, start),
                texts=texts[start:stop],
                top_k=self.top_k or 0,
                threshold=self.threshold,
                truncate=self.truncate,
            )
            for part, (start, stop) in enumerate(text_parts(texts, limits))
        ]

    def texts(self) -> list[str]:
        return texts_of(self.input)

    def respond(self, results: Sequence[SparseResult], model: str) -> SparseResponse:
        data = [
            SparseEmbedding(index=i, indices=ids.tolist(), values=values.tolist())
            for i, (ids, values) in enumerate(row for r in results for row in unpack(r))
        ]
        return SparseResponse(data=data, model=model, usage=InputUsage.of(results))


def unpack(result: SparseResult) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each text's (indices, values) from a result's packed arrays."""
    ids = np.frombuffer(result.indices, dtype="<i4")
    values = np.frombuffer(result.values, dtype="<f4")
    ends = np.cumsum(result.counts)
    starts = ends - np.asarray(result.counts, dtype=np.int64)
    return [(ids[s:e], values[s:e]) for s, e in zip(starts, ends, strict=True)]


class SparseEmbedding(msgspec.Struct):
    index: int
    indices: list[int]
    values: list[float]
    object: Literal["sparse_embedding"] = "sparse_embedding"


class SparseResponse(msgspec.Struct):
    data: list[SparseEmbedding]
    model: str
    usage: InputUsage
    object: Literal["list"] = "list"


class NativeSparseRequest(SparseRequest, kw_only=True):
    """`POST /native/v1/sparse`'s msgpack body: `inputs`, as the other native routes."""

    input_param: ClassVar[str] = "inputs"
    input: str | list[str] = ""
    inputs: list[str] = []

    def texts(self) -> list[str]:
        return texts_of(self.inputs, "inputs")

    def respond(  # type: ignore[override]
        self, results: Sequence[SparseResult], model: str
    ) -> NativeSparseResponse:
        counts = [c for r in results for c in r.counts]
        return NativeSparseResponse(
            model=model,
            indices=b"".join(r.indices for r in results),
            values=b"".join(r.values for r in results),
            offsets=np.concatenate([[0], np.cumsum(counts)]).astype(int).tolist(),
            usage=InputUsage.of(results),
        )


class NativeSparseResponse(msgspec.Struct):
    """Every text's weights in two buffers: text i is entries `offsets[i]:offsets[i+1]` of
    `indices` (little-endian int32, ascending per text) and `values` (float32)."""

    model: str
    indices: bytes
    values: bytes
    offsets: list[int]
    usage: InputUsage
