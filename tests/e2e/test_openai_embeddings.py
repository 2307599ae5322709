"""The official openai SDK against real gateway and worker processes and the real model."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
import openai
import pytest

pytestmark = pytest.mark.slow

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Shoal serves fleets of small models.",
    "naïve café — unicode is fine 🚀",
    "short",
]


def vectors(response) -> np.ndarray:
    """Rows in index order; an explicit `encoding_format="base64"` leaves decoding to us."""
    return np.array([_row(d.embedding) for d in sorted(response.data, key=lambda d: d.index)])


def _row(embedding) -> np.ndarray:
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4")
    return np.asarray(embedding)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def client(stack: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack}/v1", api_key="x", max_retries=0)


@pytest.mark.parametrize("encoding_format", [openai.NOT_GIVEN, "float", "base64"])
def test_many_inputs_match_in_process_sentence_transformers(
    client, st_model, model_name, encoding_format
) -> None:
    response = client.embeddings.create(
        model=model_name, input=TEXTS, encoding_format=encoding_format
    )
    assert response.model == model_name
    assert response.object == "list"
    assert [d.index for d in response.data] == list(range(len(TEXTS)))
    got = vectors(response)
    assert got.shape == (len(TEXTS), 384)
    assert cosine(got, st_model.encode(TEXTS)).min() > 0.9999


def test_one_string(client, st_model, model_name) -> None:
    response = client.embeddings.create(model=model_name, input=TEXTS[0])
    assert len(response.data) == 1
    assert cosine(vectors(response), st_model.encode([TEXTS[0]]))[0] > 0.9999


def test_alias_resolves_to_the_model(client, model_name) -> None:
    response = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input="x")
    assert response.model == model_name


def test_usage_counts_the_tokenizer_tokens(client, st_model, model_name) -> None:
    response = client.embeddings.create(model=model_name, input=TEXTS)
    expected = sum(len(ids) for ids in st_model.tokenizer(TEXTS)["input_ids"])
    assert response.usage.prompt_tokens == expected
    assert response.usage.total_tokens == expected


def test_token_id_inputs_embed_like_their_text(client, st_model, model_name) -> None:
    ids = [st_model.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS[:2]]
    from_ids = vectors(client.embeddings.create(model=model_name, input=ids))
    from_text = vectors(client.embeddings.create(model=model_name, input=TEXTS[:2]))
    assert cosine(from_ids, from_text).min() > 0.9999
    one = vectors(client.embeddings.create(model=model_name, input=ids[0]))
    assert cosine(one, from_text[:1])[0] > 0.9999


def test_dimensions_truncates_and_renormalizes(client, st_model, model_name) -> None:
    response = client.embeddings.create(model=model_name, input=TEXTS, dimensions=64)
    got = vectors(response)
    assert got.shape == (len(TEXTS), 64)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)
    full = st_model.encode(TEXTS)[:, :64]
    assert cosine(got, full).min() > 0.9999


def test_long_input_is_truncated_by_default(client, st_model, model_name) -> None:
    long_text = "word " * 1000
    got = vectors(client.embeddings.create(model=model_name, input=long_text))
    assert cosine(got, st_model.encode([long_text]))[0] > 0.9999  # ST truncates at 256 too
    usage = client.embeddings.create(model=model_name, input=long_text).usage
    assert usage.prompt_tokens == 256


def test_long_input_is_refused_when_truncation_is_off(client, model_name) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(
            model=model_name, input=["ok", "word " * 1000], extra_body={"truncate": False}
        )
    error = info.value.body
    assert error["param"] == "input"
    assert "input 1 has 1002 tokens" in error["message"]


async def test_async_client_concurrently(stack, st_model, model_name) -> None:
    client = openai.AsyncOpenAI(base_url=f"{stack}/v1", api_key="x", max_retries=0)
    responses = await asyncio.gather(
        *(client.embeddings.create(model=model_name, input=[t]) for t in TEXTS)
    )
    expected = st_model.encode(TEXTS)
    for i, response in enumerate(responses):
        assert cosine(vectors(response), expected[i : i + 1])[0] > 0.9999
    await client.close()


def test_models_list_and_retrieve(client, model_name) -> None:
    listed = client.models.list()
    ids = [m.id for m in listed.data]
    assert model_name in ids
    model = client.models.retrieve(model_name)
    assert model.id == model_name
    assert model.owned_by
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_each_encoder_reports_the_engine_the_default_chose(stack: str) -> None:
    """The shipped `engine = "auto"` on this CPU: OpenVINO float32 for every model with a
    compiled graph (its load-time check against float32 torch passed), torch for the
    multi-vector model (token vectors stay in torch); the same in `/v1/models` and on the
    status page."""
    import httpx

    want = {
        "all-MiniLM-L6-v2": "openvino float32",
        "test-ner": "openvino float32",
        "test-reranker": "openvino float32",
        "test-classifier": "openvino float32",
        "test-colbert": "torch float32",
    }
    with httpx.Client(base_url=stack, timeout=60) as http:
        # Only MiniLM is pinned: the others load on their first request.
        for route, model in [
            ("ner", "test-ner"),
            ("classify", "test-classifier"),
            ("multivector", "test-colbert"),
        ]:
            assert http.post(f"/v1/{route}", json={"model": model, "input": TEXTS}).is_success
        ranked = http.post(
            "/v1/rerank", json={"model": "test-reranker", "query": "q", "documents": TEXTS}
        )
        assert ranked.is_success

        def engines() -> tuple[dict, dict]:
            models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
            page = {m["id"]: m for m in http.get("/status.json").json()["models"]}
            return {m: models[m]["engine"] for m in want}, {m: page[m]["engine"] for m in want}

        deadline = time.monotonic() + 15  # engines travel in the workers' 1 s heartbeats
        while engines() != (want, want) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert engines() == (want, want)
