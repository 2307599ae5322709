"""Cohere's v2 rerank (through the real `cohere.ClientV2`) and vLLM's `/v1/score`, on the
same cross-encoder as `/v1/rerank`, through real processes; checked against
sentence-transformers' `CrossEncoder` on the fixture weights."""

from __future__ import annotations

import cohere
import httpx
import numpy as np
import pytest
from transformers import AutoTokenizer

pytestmark = pytest.mark.slow

MODEL = "test-reranker"
QUERY = "where does John live?"
DOCS = [
    "John lives in New York.",
    "The weather is fine today.",
    "filler " * 30 + "John's flat is in Brooklyn.",
    "Salmon spawn in rivers.",
    "John moved from Boston to New York last year.",
]


@pytest.fixture(scope="module")
def http(stack: str):
    with httpx.Client(base_url=stack, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def client(stack: str) -> cohere.ClientV2:
    return cohere.ClientV2(api_key="unused", base_url=stack)


@pytest.fixture(scope="module")
def cross_encoder(task_models):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(task_models.parent / "reranker"), device="cpu", max_length=128)


def test_cohere_v2_client_reranks_like_the_cross_encoder(client, cross_encoder) -> None:
    response = client.rerank(model=MODEL, query=QUERY, documents=DOCS, top_n=3)
    want = cross_encoder.predict([(QUERY, d) for d in DOCS])
    best = np.argsort(-want, kind="stable")[:3]
    assert [r.index for r in response.results] == best.tolist()
    np.testing.assert_allclose(
        [r.relevance_score for r in response.results], want[best], rtol=1e-4, atol=1e-6
    )
    assert response.id
    assert response.meta.api_version.version == "2"
    assert response.meta.billed_units.search_units == 1  # one query, up to 100 documents
    assert response.meta.tokens.input_tokens > len(DOCS) * 5
    many = client.rerank(model=MODEL, query=QUERY, documents=[f"doc {i}" for i in range(150)])
    assert len(many.results) == 150 and many.meta.billed_units.search_units == 2


def test_max_tokens_per_doc_cuts_each_document(client, cross_encoder, task_models) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(task_models.parent / "reranker"))
    long_doc = DOCS[2]
    cut = client.rerank(model=MODEL, query=QUERY, documents=[long_doc], max_tokens_per_doc=6)
    # What the cut keeps: the document's first 6 tokens, ended at the last one's offset.
    offsets = tokenizer(long_doc, add_special_tokens=False, return_offsets_mapping=True)
    first_six = long_doc[: offsets["offset_mapping"][5][1]]
    [want_cut, want_full] = cross_encoder.predict([(QUERY, first_six), (QUERY, long_doc)])
    np.testing.assert_allclose(cut.results[0].relevance_score, want_cut, rtol=1e-4, atol=1e-6)
    assert abs(want_cut - want_full) > 1e-4  # the cut changed the score
    # Cohere's default (4096) is above the model's limit: nothing more is cut.
    full = client.rerank(model=MODEL, query=QUERY, documents=[long_doc], max_tokens_per_doc=4096)
    np.testing.assert_allclose(full.results[0].relevance_score, want_full, rtol=1e-4, atol=1e-6)


def test_cohere_v2_errors_are_clear(client) -> None:
    with pytest.raises(cohere.BadRequestError, match="relevant_spans"):
        client.rerank(model=MODEL, query=QUERY, documents=DOCS, relevant_spans={"mode": "enabled"})
    with pytest.raises(cohere.BadRequestError, match="documents"):
        client.rerank(model=MODEL, query=QUERY, documents=[])
    with pytest.raises(cohere.NotFoundError):
        client.rerank(model="no-such-model", query=QUERY, documents=DOCS)


def test_score_one_to_many_and_pairwise(http, cross_encoder) -> None:
    r = http.post("/v1/score", json={"model": MODEL, "text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert [d["index"] for d in body["data"]] == list(range(len(DOCS)))  # input order
    assert {d["object"] for d in body["data"]} == {"score"}
    one_to_many = cross_encoder.predict([(QUERY, d) for d in DOCS])
    np.testing.assert_allclose(
        [d["score"] for d in body["data"]], one_to_many, rtol=1e-4, atol=1e-6
    )
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0

    firsts = ["where is John?", "where is John?", "what do salmon do?", QUERY]
    pairwise = http.post(
        "/score", json={"model": MODEL, "text_1": firsts, "text_2": DOCS[:4]}
    ).json()
    want = cross_encoder.predict(list(zip(firsts, DOCS[:4], strict=True)))
    np.testing.assert_allclose([d["score"] for d in pairwise["data"]], want, rtol=1e-4, atol=1e-6)
    single = http.post("/v1/score", json={"model": MODEL, "text_1": QUERY, "text_2": DOCS[0]})
    np.testing.assert_allclose(single.json()["data"][0]["score"], one_to_many[0], rtol=1e-4)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2"),
        ({"text_1": [], "text_2": ["c"]}, "text_1"),
        ({"text_1": "a", "text_2": []}, "text_2"),
        ({"text_1": " ", "text_2": ["c"]}, "text_1"),
    ],
)
def test_score_refuses_pairs_it_cannot_make(http, body: dict, param: str) -> None:
    r = http.post("/v1/score", json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
