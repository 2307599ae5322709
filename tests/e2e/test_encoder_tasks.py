"""NER, multi-vector, rerank and classify through real processes, checked against
transformers' pipelines and sentence-transformers on the same fixture weights."""

from __future__ import annotations

import asyncio
import base64
import warnings

import httpx
import msgspec
import numpy as np
import pytest

from tests.helpers import rounded
from tests.task_models import NER_STRIDE, PROJECTION_DIMS

pytestmark = pytest.mark.slow

MSGPACK = {"content-type": "application/msgpack"}
TEXTS = [
    "John Smith lives in New York and works at Zürich's ETH.",
    "Zoë visited München — naïve café! 🚀",
    "unaffable indivisibility",
]
LONG = " ".join(f"Person{i} travelled to City{i} on day {i}." for i in range(40))


@pytest.fixture(scope="module")
def http(stack: str):
    with httpx.Client(base_url=stack, timeout=120) as client:
        yield client


def _model_dir(task_models, name: str) -> str:
    return str(task_models.parent / name)


@pytest.fixture(scope="module")
def ner_pipelines(task_models):
    from transformers import pipeline

    warnings.filterwarnings("ignore")
    path = _model_dir(task_models, "ner")

    def make(strategy: str):
        extra = {} if strategy == "none" else {"stride": NER_STRIDE}
        return pipeline(
            "token-classification",
            model=path,
            tokenizer=path,
            device="cpu",
            aggregation_strategy=strategy,
            **extra,
        )

    return {s: make(s) for s in ("none", "simple", "first", "max", "average")}


def _expected(pipe, text: str, strategy: str) -> list[tuple]:
    key = "entity" if strategy == "none" else "entity_group"
    return [(e[key], e["start"], e["end"], float(e["score"])) for e in pipe(text)]


def _got(entities: list[dict], text: str) -> list[tuple]:
    for e in entities:
        assert text[e["start"] : e["end"]] == e["text"]
    return [(e["label"], e["start"], e["end"], e["score"]) for e in entities]


def _same(got: list[tuple], want: list[tuple]) -> None:
    assert [g[:3] for g in got] == [w[:3] for w in want]
    np.testing.assert_allclose([g[3] for g in got], [w[3] for w in want], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "max", "average"])
def test_ner_matches_the_transformers_pipeline(http, ner_pipelines, strategy) -> None:
    r = http.post("/v1/ner", json={"model": "test-ner", "input": TEXTS, "aggregation": strategy})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert body["usage"]["prompt_tokens"] > 0
    for text, item in zip(TEXTS, body["data"], strict=True):
        _same(_got(item["entities"], text), _expected(ner_pipelines[strategy], text, strategy))


@pytest.mark.parametrize("strategy", ["simple", "first", "average"])
def test_ner_across_windows_has_offsets_into_the_whole_text(http, ner_pipelines, strategy):
    r = http.post("/v1/ner", json={"model": "test-ner", "input": LONG, "aggregation": strategy})
    assert r.status_code == 200, r.text
    entities = r.json()["data"][0]["entities"]
    assert max(e["end"] for e in entities) > len(LONG) // 2  # found past the first window
    _same(_got(entities, LONG), _expected(ner_pipelines[strategy], LONG, strategy))


def test_ner_label_filter_and_threshold(http) -> None:
    body = {"model": "test-ner", "input": [*TEXTS, LONG]}
    everything = http.post("/v1/ner", json=body).json()["data"]
    only = http.post("/v1/ner", json={**body, "labels": ["LOC"], "threshold": 0.5}).json()["data"]
    for all_items, some in zip(everything, only, strict=True):
        want = [e for e in all_items["entities"] if e["label"] == "LOC" and e["score"] >= 0.5]
        assert some["entities"] == want


def test_native_ner_equals_json(http) -> None:
    payload = {"model": "test-ner", "aggregation": "first"}
    json_body = http.post("/v1/ner", json={**payload, "input": TEXTS}).json()
    r = http.post(
        "/native/v1/ner",
        headers=MSGPACK,
        content=msgspec.msgpack.encode({**payload, "inputs": TEXTS}),
    )
    assert r.status_code == 200, r.text
    native = msgspec.msgpack.decode(r.content)
    assert native["data"] == json_body["data"]


def test_classify_matches_the_pipeline(http, task_models) -> None:
    from transformers import pipeline

    path = _model_dir(task_models, "classifier")
    pipe = pipeline("text-classification", model=path, tokenizer=path, device="cpu", top_k=None)
    r = http.post("/v1/classify", json={"model": "test-classifier", "input": TEXTS})
    assert r.status_code == 200, r.text
    for text, item in zip(TEXTS, r.json()["data"], strict=True):
        want = pipe([text])[0]
        assert [x["label"] for x in item["labels"]] == [w["label"] for w in want]
        np.testing.assert_allclose(
            [x["score"] for x in item["labels"]], [w["score"] for w in want], rtol=1e-4
        )
    top = http.post(
        "/v1/classify", json={"model": "test-classifier", "input": TEXTS[0], "top_k": 1}
    ).json()
    assert len(top["data"][0]["labels"]) == 1


@pytest.fixture(scope="module")
def cross_encoder(task_models):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(_model_dir(task_models, "reranker"), device="cpu", max_length=128)


QUERY = "where does John live?"
DOCS = [
    f"document {i}: " + ("John lives in New York. " if i % 7 == 0 else "") + "filler " * i
    for i in range(100)
]


def test_rerank_matches_cross_encoder_and_sorts(http, cross_encoder) -> None:
    r = http.post("/v1/rerank", json={"model": "test-reranker", "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    want = cross_encoder.predict([(QUERY, d) for d in DOCS])
    assert sorted(x["index"] for x in results) == list(range(len(DOCS)))  # 100 > one item
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    got = np.zeros(len(DOCS))
    for x in results:
        got[x["index"]] = x["relevance_score"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert "document" not in results[0]


def test_rerank_top_n_documents_as_objects_return_documents_and_aliases(http) -> None:
    docs = [{"text": d} for d in DOCS[:10]]
    full = http.post(
        "/v1/rerank", json={"model": "test-reranker", "query": QUERY, "documents": docs}
    ).json()["results"]
    top = http.post(
        "/rerank",
        json={
            "model": "test-reranker",
            "query": QUERY,
            "documents": docs,
            "top_n": 3,
            "return_documents": True,
        },
    ).json()["results"]
    assert [x["index"] for x in top] == [x["index"] for x in full[:3]]
    assert top[0]["document"]["text"] == DOCS[top[0]["index"]]
    tei = http.post(
        "/rerank", json={"model": "test-reranker", "query": QUERY, "texts": DOCS[:10]}
    ).json()["results"]
    assert [x["index"] for x in tei] == [x["index"] for x in full]


def _expected_multivector(task_models, texts: list[str]) -> list[np.ndarray]:
    import torch
    from safetensors.torch import load_file
    from sentence_transformers import SentenceTransformer

    path = task_models.parent / "colbert"
    model = SentenceTransformer(str(path), device="cpu")
    weight = load_file(str(path / "projection.safetensors"))["weight"]
    out = []
    for text in texts:
        features = model.tokenizer(text, return_tensors="pt", truncation=True, max_length=128)
        with torch.inference_mode():
            tokens = model({k: v for k, v in features.items()})["token_embeddings"][0]
        vectors = (tokens @ weight.T)[1:-1]  # without [CLS] and [SEP]
        out.append(torch.nn.functional.normalize(vectors, dim=-1).numpy())
    return out


def test_multivector_json_and_native_match_in_process(http, task_models) -> None:
    want = _expected_multivector(task_models, TEXTS)
    floats = http.post("/v1/multivector", json={"model": "test-colbert", "input": TEXTS})
    assert floats.status_code == 200, floats.text
    body = floats.json()
    assert body["dims"] == PROJECTION_DIMS
    b64 = http.post(
        "/v1/multivector",
        json={"model": "test-colbert", "input": TEXTS, "encoding_format": "base64"},
    ).json()
    native = msgspec.msgpack.decode(
        http.post(
            "/native/v1/multivector",
            headers=MSGPACK,
            content=msgspec.msgpack.encode({"model": "test-colbert", "inputs": TEXTS}),
        ).content
    )
    matrix = np.frombuffer(native["data"], "<f4").reshape(-1, native["dims"])
    for i, expected in enumerate(want):
        item = body["data"][i]
        assert item["tokens"] == len(expected)
        np.testing.assert_allclose(np.array(item["embeddings"]), expected, atol=1e-5)
        from_b64 = np.frombuffer(base64.b64decode(b64["data"][i]["embeddings"]), "<f4")
        np.testing.assert_array_equal(
            from_b64.reshape(-1, PROJECTION_DIMS), np.array(item["embeddings"], dtype=np.float32)
        )
        rows = matrix[native["offsets"][i] : native["offsets"][i + 1]]
        np.testing.assert_array_equal(rows, np.array(item["embeddings"], dtype=np.float32))


def test_multivector_options(http) -> None:
    def tokens(**options) -> int:
        r = http.post(
            "/v1/multivector", json={"model": "test-colbert", "input": "Hi, there!", **options}
        )
        return r.json()["data"][0]["tokens"]

    assert tokens() == 4  # hi , there !
    assert tokens(skip_special=False) == 6
    assert tokens(skip_punctuation=True) == 2
    raw = http.post(
        "/v1/multivector", json={"model": "test-colbert", "input": "Hi", "normalize": False}
    ).json()
    assert abs(np.linalg.norm(raw["data"][0]["embeddings"][0]) - 1.0) > 1e-3


def test_an_embedding_model_also_serves_multivector(http) -> None:
    r = http.post("/v1/multivector", json={"model": "all-MiniLM-L6-v2", "input": "hello world"})
    assert r.status_code == 200, r.text
    assert r.json()["dims"] == 384 and r.json()["data"][0]["tokens"] == 2


async def test_mixed_traffic_on_one_worker(stack) -> None:
    calls = []
    for i in range(100):
        kind = i % 5
        if kind == 0:
            calls.append(("/v1/embeddings", {"model": "all-MiniLM-L6-v2", "input": f"text {i}"}))
        elif kind == 1:
            calls.append(("/v1/ner", {"model": "test-ner", "input": TEXTS[i % 3]}))
        elif kind == 2:
            calls.append(
                (
                    "/v1/rerank",
                    {
                        "model": "test-reranker",
                        "query": QUERY,
                        "documents": DOCS[i % 10 : i % 10 + 5],
                    },
                )
            )
        elif kind == 3:
            calls.append(("/v1/classify", {"model": "test-classifier", "input": TEXTS}))
        else:
            calls.append(("/v1/multivector", {"model": "test-colbert", "input": TEXTS[i % 3]}))
    async with httpx.AsyncClient(base_url=stack, timeout=120) as client:
        responses = await asyncio.gather(*(client.post(p, json=b) for p, b in calls))
        reference = {}
        for (path, body), r in zip(calls, responses, strict=True):
            assert r.status_code == 200, (path, r.text)
            key = (path, msgspec.json.encode(body))
            if key not in reference:
                reference[key] = (await client.post(path, json=body)).json()
            got, want = r.json(), dict(reference[key])
            got.pop("usage"), want.pop("usage")
            if path == "/v1/embeddings":
                np.testing.assert_allclose(
                    got["data"][0]["embedding"], want["data"][0]["embedding"], atol=1e-6
                )
            elif path == "/v1/multivector":
                np.testing.assert_allclose(
                    got["data"][0]["embeddings"], want["data"][0]["embeddings"], atol=1e-5
                )
            elif path == "/v1/rerank":
                assert [x["index"] for x in got["results"]] == [x["index"] for x in want["results"]]
            else:
                assert rounded(got) == rounded(want), path


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/rerank", {"model": "test-reranker", "query": "q", "documents": []}, "documents"),
        ("/v1/rerank", {"model": "test-reranker", "query": "  ", "documents": ["a"]}, "query"),
        (
            "/v1/rerank",
            {"model": "test-reranker", "query": "q", "documents": ["a"], "top_n": 0},
            "top_n",
        ),
        ("/v1/rerank", {"model": "test-reranker", "query": "q"}, "documents"),
        ("/v1/ner", {"model": "test-ner", "input": []}, "input"),
        ("/v1/ner", {"model": "test-ner", "input": "x", "aggregation": "median"}, "aggregation"),
        ("/v1/ner", {"model": "test-ner", "input": "x", "threshold": 2}, "threshold"),
        ("/v1/classify", {"model": "test-classifier", "input": "x", "top_k": 0}, "top_k"),
        ("/v1/multivector", {"model": "test-colbert", "input": []}, "input"),
    ],
)
def test_bad_task_input_is_400(http, path, body, param) -> None:
    from tests.e2e.test_errors import check_error

    check_error(http.post(path, json=body), 400, param=param)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/ner", {"model": "all-MiniLM-L6-v2", "input": "x"}),
        ("/v1/rerank", {"model": "test-ner", "query": "q", "documents": ["d"]}),
        ("/v1/embeddings", {"model": "test-reranker", "input": "x"}),
        ("/v1/classify", {"model": "test-colbert", "input": "x"}),
    ],
)
def test_a_model_that_does_not_serve_the_op_names_what_it_serves(http, path, body) -> None:
    from tests.e2e.test_errors import check_error

    error = check_error(http.post(path, json=body), 400, code="unsupported_task", param="model")
    assert "it serves" in error["message"]


def test_models_list_shows_tasks(http) -> None:
    models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert models["test-ner"]["tasks"] == ["ner"]
    assert models["all-MiniLM-L6-v2"]["tasks"] == ["embed", "multivector"]
    assert models["test-colbert"]["max_length"] == 128
