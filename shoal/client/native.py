"""The smallest native-route client: one request, vectors back as a numpy array.

The full bulk client (connection pool, pipelining, retries) builds on this.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import httpx
import msgspec
import numpy as np

from ..compat.native import NativeEmbedRequest, NativeEmbedResponse

__all__ = ["NativeError", "embed"]

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(NativeEmbedResponse).decode


class NativeError(Exception):
    """The server refused the request; carries its status and OpenAI-style error."""

    def __init__(self, status: int, code: str | None, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def embed(
    texts: Sequence[str],
    *,
    model: str,
    base_url: str = "http://127.0.0.1:8000",
    dtype: Literal["float32", "float16"] = "float32",
    dimensions: int | None = None,
    client: httpx.Client | None = None,
    timeout: float = 120.0,
) -> np.ndarray:
    """Embed `texts` through `POST /native/v1/embed`; returns `(len(texts), dims)`.

    Raises:
        NativeError: the server answered with an error.
    """
    body = _encode(
        NativeEmbedRequest(model=model, inputs=list(texts), dtype=dtype, dimensions=dimensions)
    )
    own = client is None
    http = client or httpx.Client(timeout=timeout)
    try:
        response = http.post(
            f"{base_url.rstrip('/')}/native/v1/embed",
            content=body,
            headers={"content-type": "application/msgpack", "accept": "application/msgpack"},
        )
    finally:
        if own:
            http.close()
    if response.status_code != 200:
        raise _error(response)
    result = _decode(response.content)
    return np.frombuffer(result.data, dtype=np.dtype(result.dtype).newbyteorder("<")).reshape(
        result.shape
    )


def _error(response: httpx.Response) -> NativeError:
    try:
        error = response.json()["error"]
        return NativeError(response.status_code, error.get("code"), error.get("message", ""))
    except (ValueError, KeyError, TypeError):
        return NativeError(response.status_code, None, response.text[:200])
