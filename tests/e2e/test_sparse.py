"""Sparse (SPLADE) embeddings through real processes: `/v1/sparse` against the same
pooling computed in process with transformers on the fixture masked LM."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.slow

MODEL = "test-splade"
TEXTS = [
    "Salmon swim upstream to spawn.",
    "The quick brown fox jumps over the lazy dog.",
    "Zoë visited München — naïve café! 🚀",
    "word " * 300,  # past the model's 128 tokens: truncated
]


@pytest.fixture(scope="module")
def http(stack: str):
    with httpx.Client(base_url=stack, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def expected(task_models) -> np.ndarray:
    """Each text's weights over the vocabulary, as SPLADE defines them, in process."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    path = str(task_models.parent / "splade")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForMaskedLM.from_pretrained(path).eval()
    rows = []
    with torch.no_grad():
        for text in TEXTS:
            inputs = tokenizer(text, truncation=True, max_length=128, return_tensors="pt")
            logits = model(**inputs).logits[0]
            rows.append(torch.log1p(torch.relu(logits)).amax(dim=0).numpy())
    return np.stack(rows)


def _dense(item: dict, width: int) -> np.ndarray:
    out = np.zeros(width, dtype=np.float32)
    out[item["indices"]] = item["values"]
    return out


def test_sparse_vectors_match_splade_in_process(http, expected) -> None:
    r = http.post("/v1/sparse", json={"model": MODEL, "input": TEXTS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert body["usage"]["prompt_tokens"] > 128  # the long text counted in full
    width = expected.shape[1]
    for i, item in enumerate(body["data"]):
        assert item["index"] == i and item["object"] == "sparse_embedding"
        assert item["indices"] == sorted(item["indices"])
        assert all(v > 0 for v in item["values"])
        np.testing.assert_allclose(_dense(item, width), expected[i], atol=1e-4)
        # Sparse indeed: a few hundred of the 30k ids at most.
        assert 0 < len(item["indices"]) < width // 10


def test_top_k_and_threshold_prune(http, expected) -> None:
    body = {"model": MODEL, "input": TEXTS[0], "top_k": 5}
    [top] = http.post("/v1/sparse", json=body).json()["data"]
    want = np.sort(np.argsort(-expected[0], kind="stable")[:5])
    assert top["indices"] == want.tolist()
    weights = np.sort(expected[0][expected[0] > 0])
    half = len(weights) // 2
    cut = float(weights[half - 1] + weights[half]) / 2  # between two weights, not on one
    [kept] = http.post(
        "/v1/sparse", json={"model": MODEL, "input": [TEXTS[0]], "threshold": cut}
    ).json()["data"]
    assert kept["indices"] == np.flatnonzero(expected[0] > cut).tolist()


def test_sparse_errors_are_clear(http) -> None:
    r = http.post("/v1/sparse", json={"model": "test-classifier", "input": "a"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_task"
    r = http.post("/v1/sparse", json={"model": MODEL, "input": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


def test_the_native_route_packs_the_same_weights(http) -> None:
    import msgspec

    whole = http.post("/v1/sparse", json={"model": MODEL, "input": TEXTS[:3]}).json()["data"]
    r = http.post(
        "/native/v1/sparse",
        content=msgspec.msgpack.encode({"model": MODEL, "inputs": TEXTS[:3]}),
        headers={"content-type": "application/msgpack"},
    )
    assert r.status_code == 200, r.text
    body = msgspec.msgpack.decode(r.content)
    ids = np.frombuffer(body["indices"], dtype="<i4")
    values = np.frombuffer(body["values"], dtype="<f4")
    offsets = body["offsets"]
    assert len(offsets) == 4 and offsets[0] == 0 and offsets[-1] == len(ids) == len(values)
    for i, item in enumerate(whole):
        span = slice(offsets[i], offsets[i + 1])
        assert ids[span].tolist() == item["indices"]
        np.testing.assert_allclose(values[span], item["values"], rtol=1e-6)
