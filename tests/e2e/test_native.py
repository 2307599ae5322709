"""The native msgpack route through the project's own client."""

from __future__ import annotations

import base64

import httpx
import msgspec
import numpy as np
import openai
import pytest

from shoal.client import NativeError, embed

pytestmark = pytest.mark.slow

TEXTS = ["alpha beta", "gamma", "a longer sentence about delta and epsilon"] * 5


def test_native_vectors_equal_the_json_route_bit_for_bit(stack, model_name) -> None:
    native = embed(TEXTS, model=model_name, base_url=stack)
    assert native.dtype == np.float32
    assert native.shape == (len(TEXTS), 384)
    client = openai.OpenAI(base_url=f"{stack}/v1", api_key="x")
    floats = client.embeddings.create(model=model_name, input=TEXTS, encoding_format="float")
    as_floats = np.array([d.embedding for d in floats.data], dtype=np.float32)
    assert np.array_equal(native, as_floats)
    b64 = client.embeddings.create(model=model_name, input=TEXTS, encoding_format="base64")
    as_b64 = np.stack([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in b64.data])
    assert np.array_equal(native, as_b64)


def test_float16_and_dimensions(stack, model_name) -> None:
    full = embed(TEXTS, model=model_name, base_url=stack)
    half = embed(TEXTS, model=model_name, base_url=stack, dtype="float16")
    assert half.dtype == np.float16
    np.testing.assert_allclose(half.astype(np.float32), full, atol=1e-3)
    short = embed(TEXTS, model=model_name, base_url=stack, dimensions=32)
    assert short.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(np.linalg.norm(short, axis=1), 1.0, rtol=1e-5)


def test_response_is_one_raw_buffer_with_shape_and_usage(stack, model_name) -> None:
    body = msgspec.msgpack.encode({"model": model_name, "inputs": TEXTS[:2]})
    r = httpx.post(
        f"{stack}/native/v1/embed", content=body, headers={"content-type": "application/msgpack"}
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/msgpack")
    decoded = msgspec.msgpack.decode(r.content)
    assert isinstance(decoded["data"], bytes)
    assert len(decoded["data"]) == 2 * 384 * 4
    assert decoded["shape"] == [2, 384]
    assert decoded["dtype"] == "float32"
    assert decoded["usage"]["prompt_tokens"] > 0
    assert float(r.headers["x-inference-time"]) > 0


def test_native_errors_are_typed(stack) -> None:
    with pytest.raises(NativeError) as info:
        embed(["x"], model="no-such-model", base_url=stack)
    assert info.value.status == 404
    assert info.value.code == "model_not_found"
