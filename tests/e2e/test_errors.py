"""Every bad input gets its status and OpenAI's error envelope; nothing hangs."""

from __future__ import annotations

import time

import httpx
import msgspec
import openai
import pytest

from tests.helpers import GEN_MODEL, start_gateway, wait_until
from tests.openai_schema import validate

pytestmark = pytest.mark.slow

MSGPACK = {"content-type": "application/msgpack"}
_ASK = [{"role": "user", "content": "Hi"}]
STREAMED = {
    "/v1/chat/completions": {"model": GEN_MODEL, "messages": _ASK, "max_tokens": 4},
    "/v1/completions": {"model": GEN_MODEL, "prompt": "Hi", "max_tokens": 4},
    "/v1/responses": {"model": GEN_MODEL, "input": "Hi", "max_output_tokens": 4},
}


def check_error(
    response: httpx.Response, status: int, code: str | None = None, param: str | None = None
) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    validate(body, "ErrorResponse")
    error = body["error"]
    assert error["message"]
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    return error


@pytest.fixture(scope="module")
def http(stack: str):
    with httpx.Client(base_url=stack, timeout=30) as client:
        yield client


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "all-MiniLM-L6-v2", "input": []}', "input"),
        (b'{"model": "all-MiniLM-L6-v2", "input": ""}', "input"),
        (b'{"model": "all-MiniLM-L6-v2", "input": ["a", 3]}', "input"),
        (b'{"model": "all-MiniLM-L6-v2", "input": [[]]}', "input"),
        (b'{"model": "all-MiniLM-L6-v2", "input": {"a": 1}}', "input"),
        (b'{"input": "x"}', "model"),
        (b'{"model": 7, "input": "x"}', "model"),
        (
            b'{"model": "all-MiniLM-L6-v2", "input": "x", "encoding_format": "hex"}',
            "encoding_format",
        ),
        (b'{"model": "all-MiniLM-L6-v2", "input": "x", "dimensions": 0}', "dimensions"),
        (b'{"model": "all-MiniLM-L6-v2", "input": "x", "dimensions": 385}', "dimensions"),
        (b'{"model": "all-MiniLM-L6-v2", "input": [[1, 99999999]]}', "input"),
    ],
)
def test_invalid_embedding_requests_are_400(http, body: bytes, param: str) -> None:
    r = http.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
    error = check_error(r, 400, param=param)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [b"{not json", b'{"model": "x", "input": "unterminated'])
def test_malformed_json_is_400(http, body: bytes) -> None:
    r = http.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
    assert "could not be parsed" in check_error(r, 400)["message"]


def test_an_empty_body_is_400(http) -> None:
    r = http.post("/v1/embeddings", content=b"", headers={"content-type": "application/json"})
    assert "body is required" in check_error(r, 400)["message"]


def test_unknown_model_is_404_model_not_found(http) -> None:
    r = http.post("/v1/embeddings", json={"model": "gpt-9", "input": "x"})
    error = check_error(r, 404, code="model_not_found", param="model")
    assert "gpt-9" in error["message"]
    # It lists models that serve the route's task, the first few: not the chat model.
    assert "served: 'all-MiniLM-L6-v2'" in error["message"]
    assert "SmolLM2" not in error["message"]
    check_error(http.get("/v1/models/gpt-9"), 404, code="model_not_found")


def test_unknown_route_and_wrong_method(http) -> None:
    check_error(http.get("/v1/nothing-here"), 404)
    check_error(http.get("/v1/embeddings"), 405)


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # a byte msgpack never uses
        msgspec.msgpack.encode({"model": "all-MiniLM-L6-v2"}),
        msgspec.msgpack.encode({"model": "all-MiniLM-L6-v2", "inputs": "not a list"}),
        msgspec.msgpack.encode({"model": "all-MiniLM-L6-v2", "inputs": [1, 2]}),
        msgspec.msgpack.encode({"model": "all-MiniLM-L6-v2", "inputs": ["a"], "dtype": "float64"}),
        msgspec.msgpack.encode({"model": "all-MiniLM-L6-v2", "inputs": []}),
        msgspec.msgpack.encode([1, 2, 3]),
    ],
)
def test_bad_native_requests_are_400(http, body: bytes) -> None:
    check_error(http.post("/native/v1/embed", content=body, headers=MSGPACK), 400)


def test_native_route_wants_msgpack(http) -> None:
    r = http.post("/native/v1/embed", json={"model": "all-MiniLM-L6-v2", "inputs": ["x"]})
    check_error(r, 415, code="unsupported_media_type")


def test_a_too_long_input_with_truncation_off_is_400_naming_its_length(http) -> None:
    r = http.post(
        "/v1/embeddings",
        json={"model": "all-MiniLM-L6-v2", "input": "go " * 300, "truncate": False},
    )
    error = check_error(r, 400, param="input")
    assert "302 tokens" in error["message"]


# Gateways with their own limits and queues ---------------------------------------------


def test_body_size_and_input_count_limits_are_413(nats_server, tmp_path) -> None:
    gateway, base = start_gateway(
        nats_server.url,
        tmp_path,
        {
            "SHOAL_GATEWAY__MAX_BODY_BYTES": "100000",
            "SHOAL_GATEWAY__MAX_INPUTS": "10",
            "SHOAL_GATEWAY__NO_WORKER_POLICY": "queue",
        },
    )
    try:
        big = {"model": "all-MiniLM-L6-v2", "input": ["x" * 1000] * 200}
        check_error(httpx.post(f"{base}/v1/embeddings", json=big), 413)
        many = {"model": "all-MiniLM-L6-v2", "input": ["x"] * 11}
        check_error(httpx.post(f"{base}/v1/embeddings", json=many), 413, param="input")
    finally:
        gateway.stop()


def test_input_length_token_and_max_tokens_limits(nats_server, tmp_path) -> None:
    """Checked as the request becomes jobs, before any worker: none runs here."""
    gateway, base = start_gateway(
        nats_server.url,
        tmp_path,
        {
            "SHOAL_GATEWAY__MAX_INPUT_CHARS": "100",
            "SHOAL_GATEWAY__MAX_REQUEST_CHARS": "150",
            "SHOAL_GATEWAY__MAX_REQUEST_TOKENS": "10",
            "SHOAL_GATEWAY__MAX_TOKENS": "8",
        },
    )
    model = "all-MiniLM-L6-v2"
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            r = http.post("/v1/embeddings", json={"model": model, "input": ["a", "x" * 101]})
            assert (
                "'input[1]' has 101 characters"
                in check_error(r, 400, "input_too_long", "input")["message"]
            )
            body = msgspec.msgpack.encode({"model": model, "inputs": ["x" * 101]})
            r = http.post("/native/v1/embed", content=body, headers=MSGPACK)
            check_error(r, 400, "input_too_long", "inputs")
            r = http.post("/v1/embeddings", json={"model": model, "input": ["x" * 80] * 2})
            check_error(r, 413, "request_too_large", "input")
            r = http.post("/v1/embeddings", json={"model": model, "input": [[1] * 6, [2] * 5]})
            check_error(r, 413, "request_too_large", "input")
            gen = "smollm2-135m-instruct"
            r = http.post(
                "/v1/completions", json={"model": gen, "prompt": "x" * 101, "max_tokens": 1}
            )
            check_error(r, 400, "input_too_long", "prompt")
            chat = {"model": gen, "messages": [{"role": "user", "content": "hi"}]}
            r = http.post("/v1/chat/completions", json={**chat, "max_completion_tokens": 9})
            check_error(r, 400, "max_tokens_too_large", "max_completion_tokens")
            r = http.post("/v1/completions", json={"model": gen, "prompt": "hi", "max_tokens": 9})
            check_error(r, 400, "max_tokens_too_large", "max_tokens")
    finally:
        gateway.stop()


def test_no_worker_for_the_model_is_503_with_retry_after(nats_server, tmp_path) -> None:
    gateway, base = start_gateway(nats_server.url, tmp_path)
    try:
        r = httpx.post(f"{base}/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "x"})
        check_error(r, 503, code="no_worker")
        assert int(r.headers["retry-after"]) >= 1
        assert httpx.get(f"{base}/ready").status_code == 503
        # A stream is refused before it starts, with the same status: not a 200 whose
        # first event is the error, which the SDK raises only while iterating.
        for path, body in STREAMED.items():
            r = httpx.post(f"{base}{path}", json=body | {"stream": True}, timeout=30)
            check_error(r, 503, code="no_worker")
            assert int(r.headers["retry-after"]) >= 1
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as refused:
            client.chat.completions.create(**STREAMED["/v1/chat/completions"], stream=True)
        assert refused.value.status_code == 503
    finally:
        gateway.stop()


def test_a_full_queue_is_429_at_once_and_a_missed_deadline_is_504(nats_server, tmp_path) -> None:
    gateway, base = start_gateway(
        nats_server.url,
        tmp_path,
        {
            "SHOAL_NATS__MAX_MSGS": "2",
            "SHOAL_GATEWAY__REQUEST_TIMEOUT": "3",
            "SHOAL_GATEWAY__NO_WORKER_POLICY": "queue",
        },
    )
    try:
        import concurrent.futures

        body = {"model": "all-MiniLM-L6-v2", "input": "x"}
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            waiting = [
                pool.submit(httpx.post, f"{base}/v1/embeddings", json=body, timeout=30)
                for _ in range(2)
            ]
            wait_until(lambda: _queued(nats_server.url) == 2, 10, gateway, "2 queued items")
            started = time.monotonic()
            r = httpx.post(f"{base}/v1/embeddings", json=body, timeout=30)
            assert time.monotonic() - started < 2
            check_error(r, 429, code="queue_full")
            assert int(r.headers["retry-after"]) >= 1
            chat = STREAMED["/v1/chat/completions"] | {"stream": True}
            r = httpx.post(f"{base}/v1/chat/completions", json=chat, timeout=30)
            check_error(r, 429, code="queue_full")
            for future in waiting:  # nobody serves them: each ends at its deadline
                check_error(future.result(), 504, code="timeout")
    finally:
        gateway.stop()


def _queued(nats_url: str) -> int:
    import asyncio

    from shoal.config import NatsSettings
    from shoal.queue import Bus

    async def count() -> int:
        bus = await Bus.connect(NatsSettings(url=nats_url), "probe")
        try:
            return (await bus.stream_state("SHOAL_WORK"))["messages"]
        finally:
            await bus.close()

    return asyncio.run(count())
