"""The native MessagePack route's schema: vectors as one raw buffer, never lists of floats.

Request (msgpack map): `{"model": str, "inputs": [str, ...], "dtype": "float32"|"float16"
|"int8"|"uint8"|"binary"|"ubinary", "dimensions": int?, "truncate": bool}`. Response:
`{"model", "data": bin (little-endian, row-major), "shape": [rows, columns], "dtype",
"usage": {"prompt_tokens", "total_tokens"}}`; `numpy.frombuffer(data, dtype).reshape(shape)`
reads it without a copy (binary/ubinary: packed bits, `columns` = ceil(dims / 8) bytes a
row, read as int8/uint8; `compact` says how each compact type is made).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal

import msgspec
import numpy as np

from ..config import GatewaySettings
from ..model_registry import ModelSpec
from ..queue.messages import EmbedJob, EmbedResult
from ..queue.subjects import Task
from ._constraints import ModelName
from .compact import COMPACT_TYPES, CompactType, quantize, ranges_dims
from .embed import EmbedOptions, Vectors, build_embed_jobs, join_vectors
from .errors import InvalidRequestError
from .extensions import ShoalOptions
from .jobs import Envelope, InputUsage

__all__ = ["NativeEmbedRequest", "NativeEmbedResponse"]


class NativeEmbedRequest(msgspec.Struct, kw_only=True):
    """`POST /native/v1/embed`'s body (msgpack)."""

    op: ClassVar[Task] = "embed"

    model: ModelName
    inputs: list[str]
    dtype: Literal["float32", "float16", "int8", "uint8", "binary", "ubinary"] = "float32"
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    truncate: bool = True
    shoal: ShoalOptions | None = None
    """Shoal extensions: `{"adapter": NAME}` picks a LoRA adapter of the model."""

    def options(self) -> EmbedOptions:
        return EmbedOptions(
            dimensions=self.dimensions,
            truncate=self.truncate,
            dtype="float16" if self.dtype == "float16" else "float32",  # compact: made here
            input_param="inputs",
        )

    def texts(self) -> list[str]:
        """Raises: InvalidRequestError for an empty string (as the JSON route does)."""
        if any(not text for text in self.inputs):
            raise InvalidRequestError("'inputs' must not contain empty strings", param="inputs")
        return self.inputs

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[EmbedJob]:
        return build_embed_jobs(env, spec, self.options(), limits, texts=self.texts())

    def ranges_dims(self, spec: ModelSpec) -> int | None:
        return ranges_dims(self.dtype, self.dimensions, spec.dims)

    def respond(
        self, results: Sequence[EmbedResult], model: str, ranges: np.ndarray | None = None
    ) -> NativeEmbedResponse:
        vectors = join_vectors(results)
        if self.dtype in COMPACT_TYPES:
            return NativeEmbedResponse.compact(vectors, model, self.dtype, ranges)
        return NativeEmbedResponse.from_vectors(vectors, model)


class NativeEmbedResponse(msgspec.Struct):
    model: str
    data: bytes
    shape: tuple[int, int]
    dtype: Literal["float32", "float16", "int8", "uint8", "binary", "ubinary"]
    usage: InputUsage

    @classmethod
    def from_vectors(cls, vectors: Vectors, model: str) -> NativeEmbedResponse:
        tokens = vectors.prompt_tokens
        return cls(
            model=model,
            data=vectors.data,
            shape=(vectors.rows, vectors.dims),
            dtype=vectors.dtype,
            usage=InputUsage(tokens, tokens),
        )

    @classmethod
    def compact(
        cls, vectors: Vectors, model: str, kind: CompactType, ranges: np.ndarray | None
    ) -> NativeEmbedResponse:
        packed = quantize(vectors.matrix(), kind, ranges)
        tokens = vectors.prompt_tokens
        return cls(
            model=model,
            data=packed.tobytes(),
            shape=packed.shape,  # type: ignore[arg-type]
            dtype=kind,
            usage=InputUsage(tokens, tokens),
        )
