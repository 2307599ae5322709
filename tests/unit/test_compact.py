"""Compact vectors equal sentence-transformers' `quantize_embeddings` with the same
ranges, and the Cohere v2 embed body decodes and answers in Cohere's shape."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from shoal.compat.cohere_embed import CohereEmbedRequest
from shoal.compat.compact import calibration_texts, quantize, ranges_of
from shoal.compat.errors import InvalidRequestError
from shoal.config import GatewaySettings
from shoal.model_registry import ModelSpec
from shoal.queue.messages import EmbedResult

st_quantization = pytest.importorskip("sentence_transformers.util.quantization")

DIMS = 20  # not a multiple of 8: the last byte of a packed row is padded


@pytest.fixture
def vectors() -> np.ndarray:
    return np.random.default_rng(3).standard_normal((50, DIMS)).astype(np.float32)


@pytest.mark.parametrize("kind", ["int8", "uint8", "binary", "ubinary"])
def test_each_type_equals_sentence_transformers_with_the_same_ranges(vectors, kind) -> None:
    # Calibrated on the first 30 rows: the other 20 go past the range (clipped), as an
    # index's vectors will.
    ranges = np.vstack((vectors[:30].min(0), vectors[:30].max(0)))
    want = st_quantization.quantize_embeddings(vectors, precision=kind, ranges=ranges)
    got = quantize(vectors, kind, ranges)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    if kind.endswith("binary"):
        assert got.shape == (50, 3)  # 20 bits in 3 bytes


def test_int8_needs_a_range(vectors) -> None:
    with pytest.raises(ValueError, match="calibration"):
        quantize(vectors, "int8", None)


def test_a_cut_range_is_of_the_re_normalized_cut_vectors(vectors) -> None:
    full = ranges_of(vectors, DIMS, normalize=True)
    np.testing.assert_array_equal(full, np.vstack((vectors.min(0), vectors.max(0))))
    cut = vectors[:, :8] / np.linalg.norm(vectors[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(ranges_of(vectors, 8, normalize=True)[1], cut.max(0), rtol=1e-6)
    np.testing.assert_array_equal(ranges_of(vectors, 8, normalize=False)[1], vectors[:, :8].max(0))


def test_the_calibration_set_is_fixed_english_prose() -> None:
    texts = calibration_texts()
    assert len(texts) == len(set(texts)) == 512
    assert all(40 <= len(t) <= 300 and "(" not in t and "=" not in t for t in texts)


# --- Cohere v2 embed --------------------------------------------------------------------

SPEC = ModelSpec(id="m", tasks=["embed"], source="x", dims=DIMS, max_length=128)
decode = msgspec.json.Decoder(CohereEmbedRequest).decode


def _result(matrix: np.ndarray) -> EmbedResult:
    return EmbedResult(
        request_id="r1", part=0, data=matrix.astype("<f4").tobytes(), rows=matrix.shape[0],
        dims=matrix.shape[1], prompt_tokens=7, queue_ms=0, inference_ms=0,
    )  # fmt: skip


def test_cohere_body_answers_every_asked_type(vectors) -> None:
    body = (
        b'{"model": "m", "input_type": "search_document", "texts": ["a", "b"],'
        b' "embedding_types": ["float", "int8", "ubinary", "base64"]}'
    )
    request = decode(body)
    matrix = vectors[:2]
    ranges = np.vstack((vectors.min(0), vectors.max(0)))
    assert request.ranges_dims(SPEC) == DIMS
    answer = msgspec.to_builtins(request.respond([_result(matrix)], "m", ranges))
    assert set(answer["embeddings"]) == {"float", "int8", "ubinary", "base64"}
    np.testing.assert_allclose(answer["embeddings"]["float"], matrix, rtol=1e-7)
    assert answer["embeddings"]["int8"] == quantize(matrix, "int8", ranges).tolist()
    assert answer["embeddings"]["ubinary"] == np.packbits(matrix > 0, axis=-1).tolist()
    assert answer["texts"] == ["a", "b"] and answer["response_type"] == "embeddings_by_type"
    assert answer["meta"]["billed_units"] == {"input_tokens": 7}


def test_cohere_text_inputs_and_what_is_refused() -> None:
    inputs = b'{"model": "m", "inputs": [{"content": [{"type": "text", "text": "hi"}]}]}'
    request = decode(inputs)
    assert request.input_texts() == ["hi"] and request.types() == ["float"]
    assert request.ranges_dims(SPEC) is None  # float needs no calibration
    refused = {
        b'{"model": "m", "images": ["data:image/png;base64,AA=="]}': "images",
        b'{"model": "m", "texts": ["a"], "truncate": "START"}': "truncate",
        b'{"model": "m", "texts": ["a"], "max_tokens": 5}': "max_tokens",
        b'{"model": "m", "texts": [""]}': "texts",
        b'{"model": "m", "inputs": [{"content": [{"type": "image_url"}]}]}': "inputs",
    }
    for body, param in refused.items():
        with pytest.raises(InvalidRequestError) as caught:
            decode(body).to_jobs(_ENV, SPEC, GatewaySettings())
        assert caught.value.param == param, body
    with pytest.raises(msgspec.ValidationError):
        decode(b'{"model": "m", "texts": ["a"], "embedding_types": ["float64"]}')


_ENV = None  # refused before any job is built
