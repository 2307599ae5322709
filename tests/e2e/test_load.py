"""Many clients at once, and one request too big for one work item."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import openai
import pytest

from shoal.client import embed

pytestmark = pytest.mark.slow


async def test_200_concurrent_requests_from_many_clients(stack, st_model, model_name) -> None:
    texts = [
        [f"request {i} sentence {j} about topic {i % 7}" for j in range(1 + i % 4)]
        for i in range(200)
    ]
    clients = [
        openai.AsyncOpenAI(
            base_url=f"{stack}/v1",
            api_key="x",
            max_retries=0,
            http_client=httpx.AsyncClient(timeout=120),
        )
        for _ in range(20)
    ]
    responses = await asyncio.gather(
        *(
            clients[i % len(clients)].embeddings.create(model=model_name, input=t)
            for i, t in enumerate(texts)
        )
    )
    flat = [t for group in texts for t in group]
    expected = st_model.encode(flat, batch_size=64)
    at = 0
    for group, response in zip(texts, responses, strict=True):
        got = np.array([d.embedding for d in response.data])
        assert [d.index for d in response.data] == list(range(len(group)))
        want = expected[at : at + len(group)]
        at += len(group)
        assert (got * want).sum(1).min() > 0.9999
    for client in clients:
        await client.close()


def test_2000_inputs_are_split_across_items_and_reassembled_in_order(
    stack, st_model, model_name
) -> None:
    texts = [f"item number {i}: {'lorem ipsum ' * (i % 9)}" for i in range(2000)]
    got = embed(texts, model=model_name, base_url=stack)
    expected = st_model.encode(texts, batch_size=64)
    assert got.shape == (2000, 384)
    assert (got * expected).sum(1).min() > 0.9999
