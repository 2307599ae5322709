"""The native MessagePack route's schema: vectors as one raw buffer, never lists of floats.

Request (msgpack map): `{"model": str, "inputs": [str, ...], "dtype": "float32"|"float16",
"dimensions": int?, "truncate": bool}`. Response: `{"model", "data": bin (little-endian,
row-major), "shape": [rows, dims], "dtype", "usage": {"prompt_tokens", "total_tokens"}}`;
`numpy.frombuffer(data, dtype).reshape(shape)` reads it without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal

import msgspec

from ..config import GatewaySettings
from ..model_registry import ModelSpec
from ..queue.messages import EmbedJob, EmbedResult
from ..queue.subjects import Task
from ._constraints import ModelName
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
    dtype: Literal["float32", "float16"] = "float32"
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    truncate: bool = True
    shoal: ShoalOptions | None = None
    """Shoal extensions: `{"adapter": NAME}` picks a LoRA adapter of the model."""

    def options(self) -> EmbedOptions:
        return EmbedOptions(
            dimensions=self.dimensions,
            truncate=self.truncate,
            dtype=self.dtype,
            input_param="inputs",
        )

    def texts(self) -> list[str]:
        """Raises: InvalidRequestError for an empty string (as the JSON route does)."""
        if any(not text for text in self.inputs):
            raise InvalidRequestError("'inputs' must not contain empty strings", param="inputs")
        return self.inputs

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[EmbedJob]:
        return build_embed_jobs(env, spec, self.options(), limits, texts=self.texts())

    def respond(self, results: Sequence[EmbedResult], model: str) -> NativeEmbedResponse:
        return NativeEmbedResponse.from_vectors(join_vectors(results), model)


class NativeEmbedResponse(msgspec.Struct):
    model: str
    data: bytes
    shape: tuple[int, int]
    dtype: Literal["float32", "float16"]
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
