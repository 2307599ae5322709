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


def test_under_sustained_load_passes_run_side_by_side_with_the_same_vectors(st_model) -> None:
    """The shipped default on a CPU: a worker kept busy pairs its forward passes (two
    OpenVINO streams) and still answers sentence-transformers' vectors; the status page
    counts the passes run side by side."""
    texts = load("short")[:400]
    expected = st_model.encode(texts, batch_size=32, normalize_embeddings=True)
    requests = [texts[i : i + 8] for i in range(0, len(texts), 8)]

    with local_stack() as stack:

        async def embed_all() -> tuple[list[list[list[list[float]]]], dict]:
            client = openai.AsyncOpenAI(base_url=f"{stack.base}/v1", api_key="unused")
            limit = asyncio.Semaphore(24)  # closed loop, 24 in flight: the worker stays busy

            async def one(chunk: list[str]) -> list[list[float]]:
                async with limit:
                    answer = await client.embeddings.create(model=MODEL, input=chunk)
                return [row.embedding for row in answer.data]

            async def load_rounds() -> list[list[list[list[float]]]]:
                rounds = []
                for _ in range(15):  # bounded: at most 15 x 50 requests, ~30 s here
                    rounds.append(await asyncio.gather(*(one(chunk) for chunk in requests)))
                    if paired.is_set():
                        break
                return rounds

            paired = asyncio.Event()
            loading = asyncio.create_task(load_rounds())
            async with httpx.AsyncClient(base_url=stack.base) as status:
                while not loading.done():  # heartbeats come each second
                    await asyncio.wait({loading}, timeout=0.5)
                    [worker] = (await status.get("/status.json")).json()["workers"]
                    if worker["passes_side_by_side"]:
                        paired.set()
            await client.close()
            return await loading, worker

        rounds, worker = asyncio.run(embed_all())
    assert worker["engines"][MODEL] == "openvino float32"
    assert worker["passes_side_by_side"] > 0, worker
    for answers in rounds:
        rows = np.array([row for answer in answers for row in answer], dtype=np.float32)
        np.testing.assert_allclose(rows, expected, atol=1e-4)
