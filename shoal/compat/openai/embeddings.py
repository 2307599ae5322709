"""OpenAI embeddings: https://platform.openai.com/docs/api-reference/embeddings/create"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal

import msgspec
import numpy as np

from ...config import GatewaySettings
from ...model_registry import ModelSpec
from ...queue.messages import EmbedJob, EmbedResult
from ...queue.subjects import Task
from .._constraints import ModelName, TokenId
from ..compact import COMPACT_TYPES, CompactType, quantize, ranges_dims
from ..embed import EmbedOptions, Vectors, build_embed_jobs, join_vectors
from ..errors import InvalidRequestError
from ..extensions import ShoalOptions
from ..jobs import Envelope, InputUsage

__all__ = ["Embedding", "EmbeddingRequest", "EmbeddingResponse"]


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/embeddings`'s body, as OpenAI defines it, plus Shoal's extensions."""

    op: ClassVar[Task] = "embed"

    # Fields in the order of OpenAI's reference.
    input: str | list[str | TokenId | list[TokenId]]
    """A string, a list of strings, a list of token ids, or a list of token-id lists."""
    model: ModelName
    encoding_format: Literal["float", "base64", "int8", "uint8", "binary", "ubinary"] = "float"
    """`float` and `base64` are OpenAI's; the compact types are Shoal's extension (the SDK
    passes any value through): int8/uint8 bucket each component by the model's
    calibration range, binary/ubinary pack one bit per component (`compact`)."""
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    user: str | None = None
    # --- Shoal extensions -------------------------------------------------------------
    truncate: bool = True
    """Inputs longer than the model's max length are cut to it (the default) or, with
    `false`, refused with a 400 naming their length."""
    shoal: ShoalOptions | None = None
    """Shoal extensions: `{"adapter": NAME}` picks a LoRA adapter of the model."""

    def options(self) -> EmbedOptions:
        return EmbedOptions(dimensions=self.dimensions, truncate=self.truncate)

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[EmbedJob]:
        texts, token_ids = self.inputs()
        return build_embed_jobs(env, spec, self.options(), limits, texts, token_ids)

    def ranges_dims(self, spec: ModelSpec) -> int | None:
        return ranges_dims(self.encoding_format, self.dimensions, spec.dims)

    def respond(
        self, results: Sequence[EmbedResult], model: str, ranges: np.ndarray | None = None
    ) -> EmbeddingResponse:
        vectors = join_vectors(results)
        if self.encoding_format in COMPACT_TYPES:
            return EmbeddingResponse.compact(vectors, model, self.encoding_format, ranges)
        return EmbeddingResponse.from_vectors(vectors, model, self.encoding_format)

    def inputs(self) -> tuple[list[str], list[list[int]]]:
        """`(texts, token_ids)`, exactly one of them non-empty.

        Raises:
            InvalidRequestError: empty input, an empty string, or mixed kinds of items.
        """
        value = self.input
        if isinstance(value, str):
            value = [value]
        if not value:
            raise InvalidRequestError("'input' must not be empty", param="input")
        first = value[0]
        if isinstance(first, str):
            if not all(isinstance(v, str) for v in value):
                raise _mixed()
            if any(not v for v in value):
                raise InvalidRequestError("'input' must not contain empty strings", param="input")
            return value, []  # type: ignore[return-value]
        if isinstance(first, int):
            if not all(isinstance(v, int) for v in value):
                raise _mixed()
            return [], [value]  # type: ignore[list-item]
        if not all(isinstance(v, list) and v for v in value):
            raise InvalidRequestError(
                "'input' token lists must all be non-empty lists of integers", param="input"
            )
        return [], value  # type: ignore[return-value]


def _mixed() -> InvalidRequestError:
    return InvalidRequestError(
        "'input' must be a string, a list of strings, a list of integers, or a list of "
        "lists of integers, not a mix",
        param="input",
    )


class Embedding(msgspec.Struct):
    index: int
    embedding: list[float] | str
    """Floats; base64 of the float32 bytes; or, for a compact `encoding_format`, integers
    (msgspec allows one list type in a union: a list of ints encodes as it is)."""
    object: Literal["embedding"] = "embedding"


class EmbeddingResponse(msgspec.Struct):
    data: list[Embedding]
    model: str
    usage: InputUsage
    object: Literal["list"] = "list"

    @classmethod
    def from_vectors(cls, vectors: Vectors, model: str, encoding_format: str) -> EmbeddingResponse:
        """float: a list of floats per row; base64: the row's float32 bytes, encoded once."""
        if encoding_format == "base64":
            step = vectors.dims * 4
            buf = vectors.data
            data = [
                Embedding(i, base64.b64encode(buf[i * step : (i + 1) * step]).decode())
                for i in range(vectors.rows)
            ]
        else:
            data = [Embedding(i, row) for i, row in enumerate(vectors.matrix().tolist())]
        tokens = vectors.prompt_tokens
        return cls(data=data, model=model, usage=InputUsage(tokens, tokens))

    @classmethod
    def compact(
        cls, vectors: Vectors, model: str, kind: CompactType, ranges: np.ndarray | None
    ) -> EmbeddingResponse:
        """A list of integers per row: int8/uint8 components, or packed bits as bytes."""
        packed = quantize(vectors.matrix(), kind, ranges)
        data = [Embedding(i, row) for i, row in enumerate(packed.tolist())]
        tokens = vectors.prompt_tokens
        return cls(data=data, model=model, usage=InputUsage(tokens, tokens))
