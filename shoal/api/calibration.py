"""Each embedding model's calibration range, for int8 and uint8 vectors.

The first request that asks a model for int8 or uint8 vectors makes this gateway embed
the fixed calibration set (`compact.calibration_texts`) with that model (and adapter)
through the queue, as any request; the vectors are kept, and each dimension count's
range (`compact.ranges_of`) is derived from them. Concurrent first requests share one
calibration; a failed one is forgotten, so the next request tries again. The work runs
outside the caller's context: it is not billed to the caller's key.

Every gateway calibrates for itself, with the same texts: workers on the same hardware
give the same vectors, so the same ranges. (Workers on different hardware can differ in
the last float bits, which moves a component that sits exactly on a bucket's edge.)
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import numpy as np

from ..compat.compact import calibration_texts, ranges_of
from ..compat.embed import join_vectors
from ..compat.extensions import ShoalOptions
from ..compat.openai import EmbeddingRequest
from ..model_registry import ModelSpec
from ..queue.messages import EmbedResult

Run = Callable[[EmbeddingRequest], Awaitable[Sequence[EmbedResult]]]
"""Runs an embedding request on the model through the queue (`Gateway.run`)."""

__all__ = ["Calibrations"]


class Calibrations:
    """The calibration vectors of each (model spec, adapter) this gateway was asked for."""

    def __init__(self) -> None:
        self._vectors: dict[bytes, asyncio.Task[np.ndarray]] = {}

    async def ranges(self, spec: ModelSpec, adapter: str, dims: int, run: Run) -> np.ndarray:
        """(2, dims): min and max per component of the model's (and adapter's) vectors
        cut to `dims`."""
        key = msgspec.json.encode((spec, adapter))  # a changed spec calibrates anew
        task = self._vectors.get(key)
        if task is None:
            embedded = _embed(spec, adapter, run)
            task = asyncio.create_task(embedded, context=contextvars.Context())
            self._vectors[key] = task
        try:
            vectors = await asyncio.shield(task)
        except Exception:
            if self._vectors.get(key) is task:
                del self._vectors[key]
            raise
        return ranges_of(vectors, dims, spec.normalize)


async def _embed(spec: ModelSpec, adapter: str, run: Run) -> np.ndarray:
    request = EmbeddingRequest(
        input=list(calibration_texts()),
        model=spec.id,
        shoal=ShoalOptions(adapter=adapter) if adapter else None,
    )
    return join_vectors(await run(request)).matrix()
