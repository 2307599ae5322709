"""Shoal's OpenAI-compatible responses validate against OpenAI's published schemas."""

from __future__ import annotations

import httpx
import pytest

from tests.openai_schema import validate

pytestmark = pytest.mark.slow


def test_embeddings_response_validates(stack, model_name) -> None:
    r = httpx.post(
        f"{stack}/v1/embeddings",
        json={"model": model_name, "input": ["a", "b"], "encoding_format": "float"},
    )
    assert r.status_code == 200
    validate(r.json(), "CreateEmbeddingResponse")


def test_base64_embeddings_validate_once_decoded_as_the_sdk_does(stack, model_name) -> None:
    import base64

    import numpy as np

    body = httpx.post(
        f"{stack}/v1/embeddings",
        json={"model": model_name, "input": ["a"], "encoding_format": "base64"},
    ).json()
    for item in body["data"]:
        assert isinstance(item["embedding"], str)
        item["embedding"] = np.frombuffer(base64.b64decode(item["embedding"]), "<f4").tolist()
    validate(body, "CreateEmbeddingResponse")


def test_models_responses_validate(stack, model_name) -> None:
    validate(httpx.get(f"{stack}/v1/models").json(), "ListModelsResponse")
    validate(httpx.get(f"{stack}/v1/models/{model_name}").json(), "Model")


def test_the_served_openapi_schema_documents_the_routes(stack) -> None:
    schema = httpx.get(f"{stack}/docs/openapi.json").json()
    for path in ["/v1/embeddings", "/v1/models", "/native/v1/embed", "/health", "/ready"]:
        assert path in schema["paths"], path
    body = schema["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]
    assert "application/json" in body
