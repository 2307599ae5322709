"""The gateway's exception handlers on a small app shaped like the gateway (a dependency
named `runtime`, msgspec bodies in JSON and msgpack), the OpenAPI document they imply,
and the store ids that may reach NATS KV."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest
from litestar import Litestar, post
from litestar.di import Provide
from litestar.enums import RequestEncodingType
from litestar.params import Body
from litestar.testing import TestClient

from shoal.api.answer import BATCH_ENDPOINTS
from shoal.api.app import create_app
from shoal.api.batches.lines import LineError, check_line
from shoal.api.errors import exception_handlers
from shoal.api.files import new_id, valid_id
from shoal.compat.native import NativeEmbedRequest
from shoal.compat.openai import EmbeddingRequest
from shoal.config import Settings
from shoal.model_registry import ModelSpec

SPEC = {"id": "m", "tasks": ["embed"], "source": "hf:x", "max_length": 8, "dims": 4}


@post("/models")
async def register(data: ModelSpec, runtime: str) -> str:
    return runtime


@post("/embeddings")
async def embeddings(data: EmbeddingRequest) -> str:
    return "ok"


@post("/native")
async def native(
    data: Annotated[NativeEmbedRequest, Body(media_type=RequestEncodingType.MESSAGEPACK)],
) -> str:
    return "ok"


@post("/recurse")
async def recurse() -> None:
    def down(n: int) -> int:
        return down(n + 1)

    down(0)


@pytest.fixture(scope="module")
def client():
    app = Litestar(
        [register, embeddings, native, recurse],
        dependencies={"runtime": Provide(lambda: "rt", sync_to_thread=False)},
        exception_handlers=exception_handlers,
    )
    with TestClient(app) as client:
        yield client


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_a_body_field_named_like_a_dependency_is_the_clients_400(client) -> None:
    error = error_of(client.post("/models", json={**SPEC, "runtime": "bogus"}), 400)
    assert (error["param"], error["code"]) == ("runtime", "invalid_value")
    assert "bogus" in error["message"]
    assert client.post("/models", json={**SPEC, "runtime": "dummy"}).status_code == 201


@pytest.mark.parametrize("field", ["max_length", "dims", "stride"])
def test_a_huge_model_size_is_400_naming_it(client, field: str) -> None:
    error = error_of(client.post("/models", json={**SPEC, field: 2**70}), 400)
    assert error["param"] == field


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b'{"a":' * 100_000,
        b'{"model": "m", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}",
    ],
    ids=["arrays", "objects", "closed"],
)
def test_deeply_nested_json_is_400(client, body: bytes) -> None:
    response = client.post(
        "/embeddings", content=body, headers={"content-type": "application/json"}
    )
    error = error_of(response, 400)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [b"\x91" * 100_000 + b"\xc0", b"\x81\xa1a" * 5000 + b"\xc0"])
def test_deeply_nested_msgpack_is_400(client, body: bytes) -> None:
    response = client.post("/native", content=body, headers={"content-type": "application/msgpack"})
    error_of(response, 400)


def test_a_recursion_bug_is_still_a_500(client) -> None:
    error = error_of(client.post("/recurse"), 500)
    assert error["type"] == "server_error"


def test_a_deeply_nested_batch_line_is_a_line_error() -> None:
    endpoint = BATCH_ENDPOINTS["/v1/embeddings"]
    deep = b"[" * 100_000
    raw = b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": ' + deep + b"}"
    with pytest.raises(LineError):
        check_line(raw, "/v1/embeddings", endpoint, lambda model, op: None)


def test_every_documented_error_is_openai_shaped() -> None:
    document = create_app(Settings()).openapi_schema.to_schema()
    schemas = document["components"]["schemas"]
    documented = 0
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for status, response in operation.get("responses", {}).items():
                if not status.startswith(("4", "5")):
                    continue
                documented += 1
                for media in response.get("content", {}).values():
                    schema = media["schema"]
                    if "$ref" in schema:
                        schema = schemas[schema["$ref"].split("/")[-1]]
                    assert "error" in schema.get("properties", {}), (method, path, status)
    assert documented > 50
    assert set(schemas["ErrorBody"]["properties"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("store_id", "valid"),
    [
        # Ids of their own: a generated id differs per collection (pytest-xdist's workers
        # must collect the same tests).
        pytest.param(new_id("file-"), True, id="a-new-file-id"),
        pytest.param(new_id("batch_"), True, id="a-new-batch-id"),
        ("filé", False),  # alphanumeric to Python, not a NATS key
        ("file-٣", False),
        ("", False),
        ("a.b", False),
        ("a/b", False),
        ("x" * 129, False),
    ],
)
def test_only_ascii_ids_shaped_like_the_stores_reach_kv(store_id: str, valid: bool) -> None:
    assert valid_id(store_id) is valid


def test_msgspec_still_reports_nesting_as_recursion() -> None:
    """The handler recognises msgspec's RecursionError by its message."""
    with pytest.raises(RecursionError, match="deserializing"):
        msgspec.json.decode(b"[" * 100_000)
