"""Embedding requests (from either route) to `EmbedJob`s, and their results back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec
import numpy as np

from ..config import GatewaySettings
from ..model_registry import ModelSpec
from ..queue.messages import EmbedJob, EmbedResult
from .errors import InvalidRequestError
from .jobs import Envelope, check_count, check_texts, check_token_ids, split_points

__all__ = ["EmbedOptions", "Vectors", "build_embed_jobs", "join_vectors"]


class EmbedOptions(msgspec.Struct, frozen=True, kw_only=True):
    dimensions: int | None = None
    truncate: bool = True
    dtype: Literal["float32", "float16"] = "float32"
    input_param: Literal["input", "inputs"] = "input"
    """The request's name for its inputs (the native route's is `inputs`), for errors."""


class Vectors(msgspec.Struct, frozen=True):
    """All of a request's vectors: one contiguous little-endian buffer, rows x dims."""

    data: bytes
    rows: int
    dims: int
    dtype: Literal["float32", "float16"]
    prompt_tokens: int
    queue_ms: float
    inference_ms: float
    row_tokens: list[int] = []
    """Each row's input tokens (empty from a worker that does not report them)."""

    def matrix(self) -> np.ndarray:
        """The rows as a (rows, dims) array over the buffer (no copy)."""
        dtype = "<f2" if self.dtype == "float16" else "<f4"
        return np.frombuffer(self.data, dtype=dtype).reshape(self.rows, self.dims)

    def rows_between(self, start: int, stop: int) -> Vectors:
        """Rows `start:stop` as their own Vectors, usage theirs alone (without a copy of
        the bytes beyond the slice)."""
        step = len(self.data) // max(1, self.rows)
        return msgspec.structs.replace(
            self,
            data=self.data[start * step : stop * step],
            rows=stop - start,
            prompt_tokens=sum(self.row_tokens[start:stop]),
            row_tokens=self.row_tokens[start:stop],
        )


def build_embed_jobs(
    env: Envelope,
    spec: ModelSpec,
    options: EmbedOptions,
    limits: GatewaySettings,
    texts: Sequence[str] = (),
    token_ids: Sequence[list[int]] = (),
) -> list[EmbedJob]:
    """Validate what only the model's spec can tell, then cut the inputs into items.

    Raises:
        InvalidRequestError: no inputs, an input past `max_input_chars`, or
            `dimensions` out of the model's range.
        PayloadTooLargeError: more inputs, characters or token ids than the gateway
            accepts in one request.
    """
    param = options.input_param
    check_count(len(texts) or len(token_ids), limits, param)
    check_texts(texts, limits, param)
    check_token_ids(token_ids, limits, param)
    dims = options.dimensions
    if dims is not None and not 1 <= dims <= spec.dims:
        raise InvalidRequestError(
            f"'dimensions' must be between 1 and {spec.dims} for model '{spec.id}', got {dims}",
            param="dimensions",
        )
    out_dims = dims or spec.dims
    row_bytes = out_dims * (2 if options.dtype == "float16" else 4)
    sizes = [len(t) for t in texts] if texts else [4 * len(ids) for ids in token_ids]
    parts = split_points(sizes, limits.item_max_inputs, limits.item_max_bytes, row_bytes)
    return [
        EmbedJob(
            **env.job_fields(part, start),
            texts=list(texts[start:stop]),
            token_ids=list(token_ids[start:stop]),
            dimensions=0 if dims is None or dims == spec.dims else dims,
            truncate=options.truncate,
            dtype=options.dtype,
        )
        for part, (start, stop) in enumerate(parts)
    ]


def join_vectors(results: Sequence[EmbedResult]) -> Vectors:
    """Concatenate the parts' vectors in order, without touching a float."""
    first = results[0]
    data = first.data if len(results) == 1 else b"".join(r.data for r in results)
    return Vectors(
        data=data,
        rows=sum(r.rows for r in results),
        dims=first.dims,
        dtype=first.dtype,
        prompt_tokens=sum(r.prompt_tokens for r in results),
        queue_ms=max(r.queue_ms for r in results),
        inference_ms=max(r.inference_ms for r in results),
        row_tokens=[n for r in results for n in r.row_tokens],
    )
