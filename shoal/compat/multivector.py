"""Multi-vector (late interaction, ColBERT-style) embeddings: `POST /v1/multivector`, a
tokens x dims matrix per text; the native route returns every text's rows in one buffer."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import ClassVar, Literal

import msgspec
import numpy as np

from ..config import GatewaySettings
from ..model_registry import ModelSpec
from ..queue.messages import MultiVectorJob, MultiVectorResult
from ..queue.subjects import Task
from ._constraints import ModelName
from .extensions import ShoalOptions
from .jobs import RESULT_BYTES_PER_ITEM, Envelope, InputUsage, checked_texts, split_points, texts_of

__all__ = [
    "MultiVectorRequest",
    "MultiVectorResponse",
    "NativeMultiVectorRequest",
    "NativeMultiVectorResponse",
]


class _MultiVectorOptions(msgspec.Struct, kw_only=True):
    normalize: bool = True
    skip_special: bool = True
    """Leave out the special tokens ([CLS], [SEP], ...)."""
    skip_punctuation: bool = False
    """Leave out punctuation tokens (as ColBERT does for documents)."""
    truncate: bool = True


class MultiVectorRequest(_MultiVectorOptions, kw_only=True):
    """`POST /v1/multivector`'s body."""

    op: ClassVar[Task] = "multivector"
    input_param: ClassVar[str] = "input"
    """The field holding the texts, for errors."""

    model: ModelName
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = "float"
    shoal: ShoalOptions | None = None
    """Shoal extensions: `{"adapter": NAME}` picks a LoRA adapter of the model."""

    def texts(self) -> list[str]:
        return texts_of(self.input)

    def to_jobs(
        self, env: Envelope, spec: ModelSpec, limits: GatewaySettings
    ) -> list[MultiVectorJob]:
        texts = checked_texts(self.texts(), limits, self.input_param)
        dims = spec.multivector.dims or spec.dims
        dtype = self.out_dtype
        max_length = spec.max_length
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

    @property
    def out_dtype(self) -> str:
        """The vectors' dtype in the reply (float32 on the JSON route)."""
        return "float32"

    def respond(self, results: Sequence[MultiVectorResult], model: str) -> MultiVectorResponse:
        return MultiVectorResponse.from_results(results, model, self.encoding_format)


class NativeMultiVectorRequest(MultiVectorRequest, kw_only=True):
    input_param: ClassVar[str] = "inputs"
    input: str | list[str] = ""
    inputs: list[str] = []
    dtype: Literal["float32", "float16"] = "float32"

    def texts(self) -> list[str]:
        return texts_of(self.inputs, "inputs")

    @property
    def out_dtype(self) -> str:
        return self.dtype

    def respond(  # type: ignore[override]
        self, results: Sequence[MultiVectorResult], model: str
    ) -> NativeMultiVectorResponse:
        return NativeMultiVectorResponse.from_results(results, model)


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
    usage: InputUsage
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
        return cls(data=items, model=model, dims=dims, usage=InputUsage.of(results))


class NativeMultiVectorResponse(msgspec.Struct):
    """All texts' token vectors in one buffer: text i is rows `offsets[i]:offsets[i+1]`."""

    model: str
    data: bytes
    offsets: list[int]
    dims: int
    dtype: Literal["float32", "float16"]
    usage: InputUsage

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
            usage=InputUsage.of(results),
        )
