"""One call, vectors back: the shortest way to the native route (a `Client` underneath)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .calls import EmbedDtype
from .clients import DEFAULT_URL, Client

__all__ = ["embed"]


def embed(
    texts: Sequence[str],
    *,
    model: str,
    base_url: str = DEFAULT_URL,
    dtype: EmbedDtype = "float32",
    dimensions: int | None = None,
    client: Client | None = None,
    timeout: float = 120.0,
) -> np.ndarray:
    """Embed `texts` through `POST /native/v1/embed`; returns `(len(texts), dims)`.
    Pass a `client` to reuse its connections across calls.

    Raises:
        ShoalAPIError: the server answered with an error (after retries for 429/503).
    """
    if client is not None:
        return client.embed(texts, model=model, dtype=dtype, dimensions=dimensions)
    with Client(base_url, timeout=timeout) as own:
        return own.embed(texts, model=model, dtype=dtype, dimensions=dimensions)
