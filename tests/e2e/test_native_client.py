"""The bulk client against a live server: order, equality with the JSON route, every
native operation, typed errors, and the 429 retry path under a tight queue bound."""

from __future__ import annotations

import asyncio
import base64

import httpx
import numpy as np
import pytest
from openai import OpenAI

from shoal.client import AsyncClient, Client, NotFoundError, RetryPolicy
from shoal.client.errors import BadRequestError
from tests.helpers import MODEL, start_gateway, start_worker, wait_ready

pytestmark = pytest.mark.slow

WORDS = ["fish", "river", "stone", "light", "green", "quick", "shoal", "tide", "reef", "kelp"]


def short_texts(n: int) -> list[str]:
    return [f"{WORDS[i % 10]} {WORDS[(i // 10) % 10]} {i}" for i in range(n)]


def json_route(base: str, texts: list[str]) -> np.ndarray:
    oai = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    rows = []
    for start in range(0, len(texts), 64):
        got = oai.embeddings.create(model=MODEL, input=texts[start : start + 64])
        rows += [d.embedding for d in got.data]
    return np.array(rows, dtype=np.float32)


def test_embed_iter_streams_20000_texts_in_order_equal_to_the_json_route(stack) -> None:
    texts = short_texts(20_000)
    with Client(stack) as client:
        batches = list(client.embed_iter(texts, model=MODEL, batch_size=256, concurrency=4))
        tokens = client.prompt_tokens
    assert [len(b) for b in batches[:-1]] == [256] * (len(batches) - 1)
    vectors = np.vstack(batches)
    assert vectors.shape == (20_000, 384)
    assert vectors.dtype == np.float32
    assert tokens > 20_000 * 3
    sample = [*range(0, 20_000, 97), 19_999]
    expected = json_route(stack, [texts[i] for i in sample])
    assert np.allclose(vectors[sample], expected, atol=1e-5)


def test_async_client_iterates_an_async_source_and_matches_the_sync_client(stack) -> None:
    texts = short_texts(700)

    async def source():
        for text in texts:
            yield text

    async def run() -> list[np.ndarray]:
        async with AsyncClient(stack) as client:
            return [b async for b in client.embed_iter(source(), model=MODEL, batch_size=64)]

    async_vectors = np.vstack(asyncio.run(run()))
    with Client(stack) as client:
        sync_vectors = client.embed(texts, model=MODEL)
        half = client.embed(texts[:3], model=MODEL, dtype="float16", dimensions=64)
    assert np.allclose(async_vectors, sync_vectors, atol=1e-5)
    assert half.dtype == np.float16 and half.shape == (3, 64)


def test_ner_multivector_and_rerank_equal_their_json_routes(stack) -> None:
    texts = ["John Smith lives in New York.", "Zoë visited München."]
    docs = ["John lives in New York.", "Fish swim in rivers.", "New York is big."]
    with Client(stack) as client, httpx.Client(base_url=stack, timeout=60) as http:
        entities = client.ner(texts, model="test-ner")
        ner = http.post("/v1/ner", json={"model": "test-ner", "input": texts}).json()
        assert [[(e.label, e.start, e.end) for e in found] for found in entities] == [
            [(e["label"], e["start"], e["end"]) for e in d["entities"]] for d in ner["data"]
        ]
        matrices = client.multivector(texts, model="test-colbert")
        mv = http.post(
            "/v1/multivector",
            json={"model": "test-colbert", "input": texts, "encoding_format": "base64"},
        ).json()
        for matrix, data in zip(matrices, mv["data"], strict=True):
            theirs = np.frombuffer(base64.b64decode(data["embeddings"]), dtype="<f4")
            assert np.allclose(matrix.reshape(-1), theirs, atol=1e-5)
        scores = client.rerank("where does John live?", docs, model="test-reranker")
        ranked = http.post(
            "/v1/rerank",
            json={"model": "test-reranker", "query": "where does John live?", "documents": docs},
        ).json()["results"]
        for result in ranked:
            assert scores[result["index"]] == pytest.approx(result["relevance_score"], abs=1e-6)
        pairs = [("where does John live?", docs), ("fish?", docs[1:])]
        again = list(client.rerank_iter(pairs, model="test-reranker", concurrency=2))
        assert np.allclose(again[0], scores, atol=1e-6)
        assert len(again[1]) == 2


def test_server_errors_surface_as_typed_exceptions(stack) -> None:
    with Client(stack) as client:
        with pytest.raises(NotFoundError) as missing:
            client.embed(["x"], model="no-such-model")
        assert missing.value.status == 404
        assert missing.value.code == "model_not_found"
        with pytest.raises(BadRequestError) as empty:
            client.embed(["fine", ""], model=MODEL)
        assert empty.value.status == 400
        assert client.retries == 0  # neither is worth retrying


def test_a_full_queue_is_retried_until_every_batch_is_answered(nats_server, tmp_path) -> None:
    tight = {"SHOAL_NATS__MAX_MSGS": "4"}
    worker = start_worker(nats_server.url, tmp_path, extra=tight)
    gateway, base = start_gateway(nats_server.url, tmp_path, tight)
    try:
        wait_ready(base, worker)
        texts = short_texts(400)
        policy = RetryPolicy(max_retries=100, backoff=0.05, max_backoff=0.5)
        with Client(base, retry=policy) as client:
            batches = client.embed_iter(texts, model=MODEL, batch_size=16, concurrency=12)
            vectors = np.vstack(list(batches))
            assert client.retries > 0  # 429s happened and were retried
            alone = client.embed(texts[:16], model=MODEL)
        assert vectors.shape == (400, 384)
        assert np.allclose(vectors[:16], alone, atol=1e-5)
    finally:
        gateway.stop()
        worker.stop()
