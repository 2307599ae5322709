"""What each client operation sends and how it reads the answer, without any I/O.

The sync and async clients share these: an operation is a `Call` (a path, a body and a
parser of the 200 body), and `RetryPolicy` decides what is tried again. Vectors come
back through `numpy.frombuffer` on the response's own bytes: no copy, no float objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, NamedTuple, TypeVar

import httpx
import msgspec
import numpy as np

from ..compat.extensions import ShoalOptions
from ..compat.multivector import NativeMultiVectorRequest, NativeMultiVectorResponse
from ..compat.native import NativeEmbedRequest, NativeEmbedResponse
from ..compat.ner import NativeNerRequest, NerEntity, NerResponse
from ..compat.rerank import RerankRequest, RerankResponse
from .errors import RateLimitError, ShoalAPIError, UnavailableError

__all__ = ["Call", "Dtype", "EmbedDtype", "RetryPolicy", "embed", "multivector", "ner", "rerank"]

T = TypeVar("T")
Dtype = Literal["float32", "float16"]
EmbedDtype = Literal["float32", "float16", "int8", "uint8", "binary", "ubinary"]
"""The compact types (shoal.compat.compact) come back as int8/uint8 arrays; binary and
ubinary hold 8 components a byte."""
_NUMPY = {"binary": "int8", "ubinary": "uint8"}
MSGPACK = "application/msgpack"
_HEADERS = {"content-type": MSGPACK, "accept": MSGPACK}
_JSON = {"content-type": "application/json"}
_encode = msgspec.msgpack.Encoder().encode
_encode_json = msgspec.json.Encoder().encode
_embed_response = msgspec.msgpack.Decoder(NativeEmbedResponse).decode
_ner_response = msgspec.msgpack.Decoder(NerResponse).decode
_multivector_response = msgspec.msgpack.Decoder(NativeMultiVectorResponse).decode
_rerank_response = msgspec.json.Decoder(RerankResponse).decode


class Parsed(NamedTuple, Generic[T]):
    value: T
    prompt_tokens: int


class Call(NamedTuple, Generic[T]):
    path: str
    body: bytes
    headers: dict[str, str]
    parse: Callable[[bytes], Parsed[T]]


def _shoal(adapter: str | None) -> ShoalOptions | None:
    return ShoalOptions(adapter=adapter) if adapter else None


def _array(data: bytes, dtype: str, shape: Sequence[int]) -> np.ndarray:
    kind = np.dtype(_NUMPY.get(dtype, dtype)).newbyteorder("<")
    return np.frombuffer(data, dtype=kind).reshape(shape)


def embed(
    texts: Sequence[str],
    model: str,
    dtype: EmbedDtype = "float32",
    dimensions: int | None = None,
    truncate: bool = True,
    adapter: str | None = None,
) -> Call[np.ndarray]:
    """`(len(texts), dims)` vectors from `POST /native/v1/embed`."""
    request = NativeEmbedRequest(
        model=model,
        inputs=list(texts),
        dtype=dtype,
        dimensions=dimensions,
        truncate=truncate,
        shoal=_shoal(adapter),
    )

    def parse(body: bytes) -> Parsed[np.ndarray]:
        result = _embed_response(body)
        return Parsed(_array(result.data, result.dtype, result.shape), result.usage.prompt_tokens)

    return Call("/native/v1/embed", _encode(request), _HEADERS, parse)


def ner(
    texts: Sequence[str],
    model: str,
    aggregation: str = "simple",
    labels: Sequence[str] | None = None,
    threshold: float = 0.0,
    adapter: str | None = None,
) -> Call[list[list[NerEntity]]]:
    """Each text's entities (label, text, character offsets, score)."""
    request = NativeNerRequest(
        model=model,
        inputs=list(texts),
        aggregation=aggregation,  # type: ignore[arg-type]
        labels=list(labels) if labels else None,
        threshold=threshold,
        shoal=_shoal(adapter),
    )

    def parse(body: bytes) -> Parsed[list[list[NerEntity]]]:
        result = _ner_response(body)
        return Parsed([d.entities for d in result.data], result.usage.prompt_tokens)

    return Call("/native/v1/ner", _encode(request), _HEADERS, parse)


def multivector(
    texts: Sequence[str],
    model: str,
    dtype: Dtype = "float32",
    normalize: bool = True,
    skip_special: bool = True,
    skip_punctuation: bool = False,
    truncate: bool = True,
    adapter: str | None = None,
) -> Call[list[np.ndarray]]:
    """One `(tokens, dims)` matrix per text, views into one response buffer."""
    request = NativeMultiVectorRequest(
        model=model,
        inputs=list(texts),
        dtype=dtype,
        normalize=normalize,
        skip_special=skip_special,
        skip_punctuation=skip_punctuation,
        truncate=truncate,
        shoal=_shoal(adapter),
    )

    def parse(body: bytes) -> Parsed[list[np.ndarray]]:
        result = _multivector_response(body)
        rows = _array(result.data, result.dtype, (-1, result.dims))
        offsets = result.offsets
        matrices = [rows[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
        return Parsed(matrices, result.usage.prompt_tokens)

    return Call("/native/v1/multivector", _encode(request), _HEADERS, parse)


def rerank(
    query: str,
    documents: Sequence[str],
    model: str,
    truncate: bool = True,
    adapter: str | None = None,
) -> Call[np.ndarray]:
    """Each document's relevance score, in the documents' order (not ranked)."""
    request = RerankRequest(
        model=model,
        query=query,
        documents=list(documents),
        truncate=truncate,
        shoal=_shoal(adapter),
    )

    def parse(body: bytes) -> Parsed[np.ndarray]:
        result = _rerank_response(body)
        scores = np.empty(len(documents), dtype=np.float32)
        for item in result.results:
            scores[item.index] = item.relevance_score
        return Parsed(scores, result.usage.prompt_tokens)

    return Call("/v1/rerank", _encode_json(request), _JSON, parse)


@dataclass(frozen=True)
class RetryPolicy:
    """429 (queue full), 503 (no worker yet, NATS away) and dropped connections are tried
    again, after the server's `Retry-After` or exponential backoff, whichever is longer.
    Every operation is idempotent, so a retry never does harm."""

    max_retries: int = 8
    backoff: float = 0.25
    max_backoff: float = 10.0

    def delay(self, attempt: int, failure: Any) -> float | None:
        """Seconds to wait before attempt `attempt + 1`, or None to give up."""
        if attempt >= self.max_retries:
            return None
        if isinstance(failure, ShoalAPIError) and not isinstance(
            failure, (RateLimitError, UnavailableError)
        ):
            return None
        if not isinstance(failure, (ShoalAPIError, httpx.TransportError)):
            return None
        wait = min(self.max_backoff, self.backoff * 2**attempt)
        server = getattr(failure, "retry_after", None)
        return max(wait, server or 0.0)
