"""Cohere's v2 embed through the real `cohere.ClientV2`, and compact vectors on the OpenAI
and native routes, against real processes; checked against sentence-transformers in
process: float as the model gives it, int8/uint8/binary/ubinary as its
`quantize_embeddings` makes them from the same calibration range."""

from __future__ import annotations

import cohere
import numpy as np
import openai
import pytest

from shoal.client import Client
from shoal.compat.compact import calibration_texts
from tests.helpers import MODEL

pytestmark = pytest.mark.slow

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Shoal serves fleets of small models.",
    "Salmon spawn in the rivers where they were born.",
    "naïve café — unicode is fine",
]


@pytest.fixture(scope="module")
def client(stack: str) -> cohere.ClientV2:
    return cohere.ClientV2(api_key="unused", base_url=stack)


@pytest.fixture(scope="module")
def reference(st_model):
    """The model's float vectors of TEXTS, and its calibration range (the same texts
    the gateway calibrates with), both from sentence-transformers in process."""
    calibration = st_model.encode(list(calibration_texts()))
    ranges = np.vstack((calibration.min(0), calibration.max(0)))
    return st_model.encode(TEXTS), ranges


def _near_equal(got, want: np.ndarray, floats: np.ndarray, kind: str) -> None:
    """Equal, but where the float vectors of two engines differ in the last bits a
    component on a bucket's edge (or at 0, for bits) may land one step over."""
    got = np.asarray(got, dtype=want.dtype)
    assert got.shape == want.shape
    if kind.endswith("binary"):
        differ = np.unpackbits(got.view(np.uint8), axis=-1) != np.unpackbits(
            want.view(np.uint8), axis=-1
        )
        assert np.all(np.abs(floats[differ[:, : floats.shape[1]]]) < 1e-4)
    else:
        steps = np.abs(got.astype(int) - want.astype(int))
        assert steps.max() <= 1 and steps.mean() < 0.005, (steps.max(), steps.mean())


def test_cohere_v2_client_embeds_every_type(client, reference) -> None:
    from sentence_transformers.util.quantization import quantize_embeddings

    floats, ranges = reference
    types = ["float", "int8", "uint8", "binary", "ubinary"]
    response = client.embed(
        model=MODEL, texts=TEXTS, input_type="search_document", embedding_types=types
    )
    got = response.embeddings
    np.testing.assert_allclose(np.array(got.float_), floats, atol=2e-5)
    for kind in types[1:]:
        want = quantize_embeddings(floats, precision=kind, ranges=ranges)
        _near_equal(getattr(got, kind), want, floats, kind)
    assert len(got.binary[0]) == floats.shape[1] // 8
    assert response.texts == TEXTS and response.id
    assert response.meta.billed_units.input_tokens > len(TEXTS) * 5
    assert response.meta.api_version.version == "2"


def test_cohere_output_dimension_and_text_inputs(client, st_model) -> None:
    from cohere import EmbedInput, TextEmbedContent

    response = client.embed(
        model=MODEL,
        inputs=[EmbedInput(content=[TextEmbedContent(text=t)]) for t in TEXTS[:2]],
        input_type="search_query",
        embedding_types=["float", "int8"],
        output_dimension=128,
    )
    cut = st_model.encode(TEXTS[:2])[:, :128]
    cut /= np.linalg.norm(cut, axis=1, keepdims=True)
    np.testing.assert_allclose(np.array(response.embeddings.float_), cut, atol=2e-5)
    assert np.array(response.embeddings.int8).shape == (2, 128)


def test_cohere_errors_are_400s_naming_the_parameter(client) -> None:
    with pytest.raises(cohere.BadRequestError) as caught:
        client.embed(model=MODEL, texts=["a"], input_type="search_query", truncate="START")
    assert caught.value.body["error"]["param"] == "truncate"
    with pytest.raises(cohere.BadRequestError):
        client.embed(model=MODEL, images=["data:image/png;base64,AA=="], input_type="image")


def test_the_routes_agree_on_compact_vectors(client, stack: str) -> None:
    """The same int8 and packed bits from Cohere's route, OpenAI's (an `encoding_format`
    extension the SDK passes through) and the native route."""
    cohere_types = client.embed(
        model=MODEL, texts=TEXTS, input_type="search_document", embedding_types=["int8", "binary"]
    ).embeddings
    oa = openai.OpenAI(base_url=f"{stack}/v1", api_key="x", max_retries=0)
    for kind in ("int8", "binary"):
        response = oa.embeddings.create(model=MODEL, input=TEXTS, encoding_format=kind)
        assert [d.embedding for d in response.data] == getattr(cohere_types, kind)
        with Client(stack) as native:
            array = native.embed(TEXTS, model=MODEL, dtype=kind)
        assert array.dtype == np.int8
        assert array.tolist() == getattr(cohere_types, kind)
