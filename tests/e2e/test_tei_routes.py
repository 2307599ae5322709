"""TEI's routes under a model's TEI base URL, `/tei/{model}`, through the real
`huggingface_hub.InferenceClient` (what LangChain's `HuggingFaceEndpointEmbeddings` and
Haystack's TEI embedders call) with only its base URL changed, and through TEI's own
request shapes; answers checked against the same requests on Shoal's own routes and
against sentence-transformers in process."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from huggingface_hub import InferenceClient

from tests.helpers import MODEL

pytestmark = pytest.mark.slow

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Shoal serves fleets of small models."]


@pytest.fixture
def online(monkeypatch) -> None:
    """The suite runs with HF_HUB_OFFLINE=1, which makes `InferenceClient` refuse every
    HTTP call, to a local server too; the server here is local, not the hub."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.fixture(scope="module")
def http(stack: str):
    with httpx.Client(base_url=stack, timeout=120) as client:
        yield client


def test_inference_client_feature_extraction_and_similarity(stack: str, st_model, online) -> None:
    client = InferenceClient(base_url=f"{stack}/tei/{MODEL}")
    got = client.feature_extraction(TEXTS[0])
    np.testing.assert_allclose(got.reshape(-1), st_model.encode(TEXTS[0]), atol=2e-5)
    many = client.feature_extraction(TEXTS, truncate=True)
    assert many.shape == (2, 384)
    similarity = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS)
    want = st_model.encode(TEXTS) @ st_model.encode(TEXTS[0])
    np.testing.assert_allclose(similarity, want, atol=2e-5)


def test_inference_client_text_classification(stack: str, http, online) -> None:
    client = InferenceClient(base_url=f"{stack}/tei/test-classifier")
    got = client.text_classification("What a lovely day.")
    ours = http.post(
        "/v1/classify", json={"model": "test-classifier", "input": "What a lovely day."}
    )
    best = ours.json()["data"][0]["labels"][0]
    top = got[0] if isinstance(got, list) else got
    assert top.label == best["label"] and top.score == pytest.approx(best["score"])


def test_tei_embed_sparse_predict_rerank_and_info(http) -> None:
    embed = http.post(f"/tei/{MODEL}/embed", json={"inputs": TEXTS, "normalize": True})
    assert embed.status_code == 200 and np.array(embed.json()).shape == (2, 384)

    sparse = http.post("/tei/test-splade/embed_sparse", json={"inputs": TEXTS[0]}).json()
    ours = http.post("/v1/sparse", json={"model": "test-splade", "input": TEXTS[0]}).json()
    assert [p["index"] for p in sparse[0]] == ours["data"][0]["indices"]

    batch = http.post("/tei/test-classifier/predict", json={"inputs": TEXTS}).json()
    assert len(batch) == 2 and {"score", "label"} == set(batch[0][0])

    body = {"query": "who lives in New York?", "texts": ["Salmon.", "John lives in New York."]}
    ranked = http.post("/tei/test-reranker/rerank", json=body | {"return_text": True}).json()
    assert [r["index"] for r in ranked] == [1, 0] and ranked[0]["text"] == body["texts"][1]

    info = http.get(f"/tei/{MODEL}/info").json()
    assert info["model_id"] == MODEL and info["max_input_length"] == 256
    assert info["model_type"] == {"embedding": {}}


def test_langchain_tei_embeddings(stack: str, st_model, online) -> None:
    """LangChain's `HuggingFaceEndpointEmbeddings`, its URL as the model. (1.2.0, the last
    release that takes a URL, pins huggingface_hub<1: it goes in without its dependencies,
    see the Makefile, and this test is what says it works beside hub 2.x.)"""
    from langchain_huggingface import HuggingFaceEndpointEmbeddings

    embeddings = HuggingFaceEndpointEmbeddings(model=f"{stack}/tei/{MODEL}")
    docs = embeddings.embed_documents(TEXTS)
    np.testing.assert_allclose(docs, st_model.encode(TEXTS), atol=2e-5)
    query = embeddings.embed_query(TEXTS[1])
    np.testing.assert_allclose(query, st_model.encode(TEXTS[1]), atol=2e-5)


def test_haystack_tei_embedders(stack: str, st_model, online) -> None:
    """Haystack's TEI embedders with their defaults, `normalize=False` among them: a model
    that normalizes itself answers its own (unit) vectors."""
    from haystack import Document
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceAPIDocumentEmbedder,
        HuggingFaceAPITextEmbedder,
    )

    params = {
        "api_type": "text_embeddings_inference",
        "api_params": {"url": f"{stack}/tei/{MODEL}"},
    }
    text = HuggingFaceAPITextEmbedder(**params).run(text=TEXTS[0])["embedding"]
    np.testing.assert_allclose(text, st_model.encode(TEXTS[0]), atol=2e-5)
    docs = HuggingFaceAPIDocumentEmbedder(**params).run([Document(content=t) for t in TEXTS])
    got = [d.embedding for d in docs["documents"]]
    np.testing.assert_allclose(got, st_model.encode(TEXTS), atol=2e-5)


def test_tei_errors_are_tei_shaped(http) -> None:
    bad = http.post(f"/tei/{MODEL}/embed", json={"inputs": TEXTS, "prompt_name": "query"})
    assert bad.status_code == 422
    assert bad.json()["error_type"] == "Validation" and "prompt_name" in bad.json()["error"]
    malformed = http.post(
        f"/tei/{MODEL}/embed",
        content=b'{"inputs": 3}',
        headers={"content-type": "application/json"},
    )
    assert malformed.status_code == 422 and malformed.json()["error_type"] == "Validation"
    missing = http.post("/tei/no-such-model/embed", json={"inputs": "a"})
    assert missing.status_code == 404 and missing.json()["error_type"] == "Validation"
    wrong_task = http.post("/tei/test-reranker/embed", json={"inputs": "a"})
    assert wrong_task.status_code == 422
