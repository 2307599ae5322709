"""Cohere's v2 embed: `POST /v2/embed`, as `cohere.ClientV2().embed` sends it.

`texts` (or `inputs` whose content is text), `model`, `input_type`, `embedding_types`
(any of float, int8, uint8, binary, ubinary, base64; float when none is named),
`output_dimension` (Matryoshka: the first components, re-normalized), `truncate`
(`END`, the default, or `NONE`). The answer has one list per asked type, the texts, and
`meta` with the billed input tokens. How the compact types are made: `compact`.

Accepted and not used: `input_type` (none of the served models has query or document
prompts), `priority` (live requests are served in arrival order). Refused with a 400:
images, `truncate: START`, and `max_tokens` below the model's own limit.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal

import msgspec
import numpy as np

from ..config import GatewaySettings
from ..model_registry import ModelSpec
from ..queue.messages import EmbedJob, EmbedResult
from ..queue.subjects import Task
from ._constraints import ModelName
from .compact import quantize, ranges_dims
from .embed import EmbedOptions, build_embed_jobs, join_vectors
from .errors import InvalidRequestError
from .extensions import ShoalOptions
from .jobs import Envelope
from .rerank import CohereApiVersion

__all__ = ["CohereEmbedRequest", "CohereEmbedResponse"]

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


class CohereContent(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class CohereInput(msgspec.Struct):
    content: list[CohereContent]


class CohereEmbedRequest(msgspec.Struct, kw_only=True):
    """`POST /v2/embed`'s body."""

    op: ClassVar[Task] = "embed"

    model: ModelName
    input_type: str | None = None
    texts: list[str] | None = None
    images: list[str] | None = None
    inputs: list[CohereInput] | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    output_dimension: Annotated[int, msgspec.Meta(ge=1)] | None = None
    embedding_types: list[EmbeddingType] | None = None
    truncate: Literal["NONE", "START", "END"] = "END"
    priority: int | None = None
    shoal: ShoalOptions | None = None
    """Shoal extensions: `{"adapter": NAME}` picks a LoRA adapter of the model."""

    def types(self) -> list[EmbeddingType]:
        return list(dict.fromkeys(self.embedding_types or ["float"]))

    def input_texts(self) -> list[str]:
        """Raises: InvalidRequestError for images, no texts, or an empty text."""
        if self.images:
            raise InvalidRequestError("image inputs are not supported", param="images")
        if self.texts is not None and self.inputs is not None:
            raise InvalidRequestError("send 'texts' or 'inputs', not both", param="texts")
        if self.inputs is not None:
            texts = []
            for i, one in enumerate(self.inputs):
                parts = [c.text for c in one.content if c.type == "text" and c.text]
                if len(parts) != len(one.content) or not parts:
                    raise InvalidRequestError(
                        f"'inputs[{i}]' must hold text content only", param="inputs"
                    )
                texts.append(" ".join(parts))
        else:
            texts = self.texts or []
        if any(not t for t in texts):
            raise InvalidRequestError("'texts' must not contain empty strings", param="texts")
        return texts

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[EmbedJob]:
        if self.truncate == "START":
            raise InvalidRequestError(
                "truncate 'START' is not supported: inputs are cut at the end ('END') or "
                "refused when too long ('NONE')",
                param="truncate",
            )
        if self.max_tokens is not None and self.max_tokens < spec.max_length:
            raise InvalidRequestError(
                f"max_tokens below the model's limit ({spec.max_length}) is not supported",
                param="max_tokens",
            )
        options = EmbedOptions(
            dimensions=self.output_dimension,
            truncate=self.truncate == "END",
            input_param="texts",
        )
        return build_embed_jobs(env, spec, options, limits, texts=self.input_texts())

    def ranges_dims(self, spec: ModelSpec) -> int | None:
        return ranges_dims(self.types(), self.output_dimension, spec.dims)

    def respond(
        self, results: Sequence[EmbedResult], model: str, ranges: np.ndarray | None = None
    ) -> CohereEmbedResponse:
        vectors = join_vectors(results)
        matrix = vectors.matrix()
        embeddings = CohereEmbeddings()
        for kind in self.types():
            if kind == "float":
                embeddings.float_ = matrix.tolist()
            elif kind == "base64":
                embeddings.base64_ = [base64.b64encode(row.tobytes()).decode() for row in matrix]
            else:
                setattr(embeddings, kind, quantize(matrix, kind, ranges).tolist())
        return CohereEmbedResponse(
            id=results[0].request_id if results else "",
            embeddings=embeddings,
            texts=self.input_texts(),
            meta=CohereEmbedMeta(billed_units=CohereInputUnits(vectors.prompt_tokens)),
        )


class CohereEmbeddings(msgspec.Struct, omit_defaults=True):
    """One list per asked type, each row in the order of the texts."""

    float_: list[list[float]] | None = msgspec.field(default=None, name="float")
    int8: list[list[int]] | None = None
    uint8: list[list[int]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None
    base64_: list[str] | None = msgspec.field(default=None, name="base64")


class CohereInputUnits(msgspec.Struct):
    input_tokens: int


class CohereEmbedMeta(msgspec.Struct):
    billed_units: CohereInputUnits
    api_version: CohereApiVersion = msgspec.field(default_factory=CohereApiVersion)


class CohereEmbedResponse(msgspec.Struct):
    id: str
    embeddings: CohereEmbeddings
    texts: list[str]
    meta: CohereEmbedMeta
    response_type: Literal["embeddings_by_type"] = "embeddings_by_type"
