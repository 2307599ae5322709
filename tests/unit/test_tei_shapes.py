"""TEI's bodies become the Shoal requests that do the same work, and Shoal's answers
become TEI's shapes; errors become TEI's `{"error", "error_type"}` with TEI's status."""

from __future__ import annotations

import msgspec
import pytest

from shoal.compat.classify import ClassifyData, ClassifyResponse, ClassLabel
from shoal.compat.errors import InvalidRequestError, PayloadTooLargeError
from shoal.compat.jobs import InputUsage
from shoal.compat.openai.embeddings import Embedding, EmbeddingResponse
from shoal.compat.rerank import RerankResponse, RerankResult
from shoal.compat.tei import TeiEmbed, TeiPredict, TeiRerank, error_body
from shoal.model_registry import ModelSpec

SPEC = ModelSpec(id="m", tasks=["embed"], source="x", dims=4, max_length=16)
UNNORMALIZED = ModelSpec(
    id="u", tasks=["embed"], source="x", dims=4, max_length=16, normalize=False
)


def test_embed_maps_to_an_embeddings_request_and_refuses_what_it_cannot_serve() -> None:
    request = msgspec.convert({"inputs": "hi", "dimensions": 2}, TeiEmbed).as_request(SPEC)
    assert (request.inputs(), request.model, request.dimensions, request.truncate) == (
        (["hi"], []), "m", 2, True,
    )  # fmt: skip
    refused = {
        "truncation_direction": {"inputs": "a", "truncation_direction": "Left"},
        "prompt_name": {"inputs": "a", "prompt_name": "query"},
    }
    for param, body in refused.items():
        with pytest.raises(InvalidRequestError) as caught:
            msgspec.convert(body, TeiEmbed).as_request(SPEC)
        assert caught.value.param == param
    # normalize=false is served on every model: it never undoes a model's own
    # normalization (Haystack's TEI embedders send it by default), so the vectors are the
    # model's; true makes unit vectors of a model that does not normalize.
    for spec in (SPEC, UNNORMALIZED):
        msgspec.convert({"inputs": "a", "normalize": False}, TeiEmbed).as_request(spec)
    raw = [[3.0, 4.0]]
    as_is = msgspec.convert({"inputs": "a", "normalize": False}, TeiEmbed)
    unit = msgspec.convert({"inputs": "a"}, TeiEmbed)
    response = EmbeddingResponse(
        data=[Embedding(embedding=raw[0], index=0)], model="u", usage=InputUsage(1, 1)
    )
    assert as_is.answer(response) == raw
    assert unit.answer(response)[0] == pytest.approx([0.6, 0.8])


def test_predict_answers_one_list_for_one_text_and_a_list_each_for_several() -> None:
    labels = [ClassLabel("POSITIVE", 0.9), ClassLabel("NEGATIVE", 0.1)]
    response = ClassifyResponse(
        data=[ClassifyData(0, labels), ClassifyData(1, labels)], model="m", usage=InputUsage(1, 1)
    )
    one = msgspec.convert({"inputs": "a"}, TeiPredict)
    assert one.answer(response) == [
        {"score": 0.9, "label": "POSITIVE"},
        {"score": 0.1, "label": "NEGATIVE"},
    ]
    several = msgspec.convert({"inputs": ["a", "b"]}, TeiPredict)
    assert len(several.answer(response)) == 2
    with pytest.raises(InvalidRequestError):
        msgspec.convert({"inputs": "a", "raw_scores": True}, TeiPredict).as_request(SPEC)


def test_rerank_answers_index_score_and_text_when_asked() -> None:
    body = msgspec.convert({"query": "q", "texts": ["a", "b"], "return_text": True}, TeiRerank)
    response = RerankResponse(
        results=[RerankResult(1, 0.8), RerankResult(0, 0.2)], model="m", usage=InputUsage(1, 1)
    )
    assert body.answer(response) == [
        {"index": 1, "score": 0.8, "text": "b"},
        {"index": 0, "score": 0.2, "text": "a"},
    ]


def test_errors_take_teis_status_and_shape() -> None:
    assert error_body(InvalidRequestError("bad", param="x")) == (
        422, {"error": "bad", "error_type": "Validation"},
    )  # fmt: skip
    status, body = error_body(PayloadTooLargeError("big"))
    assert status == 413 and body["error_type"] == "Validation"
