"""A model served with `engine = "openvino"` by real processes (nats-server, an encoder
worker, the gateway), through the official openai SDK: the same vectors as
sentence-transformers, under concurrent requests of varied batch shapes."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import openai

from perf.stack import local_stack
from perf.texts import load
from tests.helpers import MODEL


def test_openvino_engine_serves_sentence_transformers_vectors(st_model) -> None:
    texts = load("short")[:60] + load("passages")[:12]
    expected = st_model.encode(texts, batch_size=16, normalize_embeddings=True)
    # Requests of 1 to 12 texts at once: the worker forms batches of many shapes.
    chunks, start, size = [], 0, 1
    while start < len(texts):
        chunks.append(texts[start : start + size])
        start, size = start + size, size % 12 + 1
    chunks += [[t] for t in texts[:20]]

    with local_stack({"engine": "openvino"}) as stack:

        async def embed_all() -> list[list[float]]:
            client = openai.AsyncOpenAI(base_url=f"{stack.base}/v1", api_key="unused")
            answers = await asyncio.gather(
                *(client.embeddings.create(model=MODEL, input=chunk) for chunk in chunks)
            )
            await client.close()
            return [row.embedding for answer in answers for row in answer.data]

        rows = asyncio.run(embed_all())
        # The worker holds the compiled copy beside the torch weights: the engine is in use.
        torch_bytes = sum(t.numel() * t.element_size() for t in st_model.parameters())
        [worker] = httpx.get(f"{stack.base}/status.json").json()["workers"]
        assert worker["resident_bytes"] >= 1.9 * torch_bytes
    index = {t: i for i, t in enumerate(texts)}
    sent = [index[t] for chunk in chunks for t in chunk]
    np.testing.assert_allclose(np.array(rows, dtype=np.float32), expected[sent], atol=1e-4)
