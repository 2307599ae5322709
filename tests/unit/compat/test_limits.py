"""The gateway's input limits, checked where each route's request becomes jobs, and the
schema bounds that keep huge ints out of queue messages."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shoal.compat.classify import ClassifyRequest
from shoal.compat.embed import EmbedOptions, build_embed_jobs
from shoal.compat.errors import InvalidRequestError, PayloadTooLargeError, ShoalError
from shoal.compat.jobs import Envelope
from shoal.compat.multivector import MultiVectorRequest, NativeMultiVectorRequest
from shoal.compat.native import NativeEmbedRequest
from shoal.compat.ner import NativeNerRequest, NerRequest
from shoal.compat.openai import EmbeddingRequest
from shoal.compat.openai.chat import ChatCompletionRequest
from shoal.compat.openai.completions import CompletionRequest
from shoal.compat.rerank import RerankRequest
from shoal.config import GatewaySettings
from shoal.model_registry import ModelSpec

LIMITS = GatewaySettings(
    max_inputs=4, max_input_chars=10, max_request_chars=25, max_request_tokens=6, max_tokens=50
)
ENV = Envelope("req", "m", "inbox", 0.0)
SPEC = ModelSpec(id="m", tasks=["embed"], source="x", max_length=8, dims=4, runtime="dummy")
CONTEXT = 100
GEN_SPEC = ModelSpec(
    id="m", tasks=["generate"], source="x", max_length=CONTEXT, runtime="transformers"
)
BIG = 2**70


def refused(call: Any) -> ShoalError:
    with pytest.raises(ShoalError) as info:
        call()
    return info.value


def embed(body: dict) -> Any:
    request = msgspec.convert({"model": "m", **body}, EmbeddingRequest)
    texts, token_ids = request.inputs()
    return lambda: build_embed_jobs(ENV, SPEC, request.options(), LIMITS, texts, token_ids)


def native_embed(inputs: list[str]) -> Any:
    request = NativeEmbedRequest(model="m", inputs=inputs)
    return lambda: build_embed_jobs(ENV, SPEC, request.options(), LIMITS, request.texts())


def tasks(kind: type, field: str, texts: list[str]) -> Any:
    request = msgspec.convert({"model": "m", field: texts}, kind)
    return lambda: request.to_jobs(ENV, SPEC, LIMITS)


# Every route that takes text: a builder of its jobs from a list of texts, and the field.
TEXT_ROUTES = {
    "embeddings": (lambda texts: embed({"input": texts}), "input"),
    "native-embed": (native_embed, "inputs"),
    "ner": (lambda texts: tasks(NerRequest, "input", texts), "input"),
    "native-ner": (lambda texts: tasks(NativeNerRequest, "inputs", texts), "inputs"),
    "multivector": (lambda texts: tasks(MultiVectorRequest, "input", texts), "input"),
    "native-multivector": (
        lambda texts: tasks(NativeMultiVectorRequest, "inputs", texts),
        "inputs",
    ),
    "classify": (lambda texts: tasks(ClassifyRequest, "input", texts), "input"),
    "rerank": (
        lambda texts: (
            lambda: RerankRequest(model="m", query="q", documents=texts).to_jobs(ENV, SPEC, LIMITS)
        ),
        "documents",
    ),
    "completions": (
        lambda texts: (
            lambda: CompletionRequest(model="m", prompt=texts).to_jobs(ENV, GEN_SPEC, LIMITS)
        ),
        "prompt",
    ),
    "chat": (
        lambda texts: (
            lambda: generate(chat(messages=[{"role": "user", "content": t} for t in texts]))
        ),
        "messages",
    ),
}


@pytest.mark.parametrize("route", TEXT_ROUTES)
def test_inputs_within_the_limits_become_jobs(route: str) -> None:
    build, _ = TEXT_ROUTES[route]
    assert build(["a" * 10, "b" * 10])()  # exactly at max_input_chars; 20 (+1) <= 25


@pytest.mark.parametrize("route", TEXT_ROUTES)
def test_one_input_past_max_input_chars_is_400_input_too_long(route: str) -> None:
    build, param = TEXT_ROUTES[route]
    error = refused(build(["ok", "x" * 11]))
    assert isinstance(error, InvalidRequestError)
    assert (error.status_code, error.param, error.code) == (400, param, "input_too_long")
    assert f"'{param}[1]' has 11 characters" in error.message


@pytest.mark.parametrize("route", TEXT_ROUTES)
def test_inputs_past_max_request_chars_are_413(route: str) -> None:
    build, param = TEXT_ROUTES[route]
    error = refused(build(["x" * 9, "x" * 9, "x" * 9]))
    assert isinstance(error, PayloadTooLargeError)
    assert (error.status_code, error.param, error.code) == (413, param, "request_too_large")


def test_the_native_embed_count_limit_names_inputs() -> None:
    error = refused(native_embed(["a"] * 5))
    assert (error.status_code, error.param) == (413, "inputs")


def test_a_rerank_query_counts_toward_the_limits() -> None:
    long_query = RerankRequest(model="m", query="q" * 11, documents=["d"])
    error = refused(lambda: long_query.to_jobs(ENV, SPEC, LIMITS))
    assert (error.status_code, error.param, error.code) == (400, "query", "input_too_long")
    total = RerankRequest(model="m", query="q" * 10, documents=["d" * 8, "d" * 8])
    error = refused(lambda: total.to_jobs(ENV, SPEC, LIMITS))
    assert (error.status_code, error.param) == (413, "documents")


def test_too_many_prompts_is_413() -> None:
    request = CompletionRequest(model="m", prompt=["a"] * 5)
    error = refused(lambda: request.to_jobs(ENV, GEN_SPEC, LIMITS))
    assert (error.status_code, error.param) == (413, "prompt")


@pytest.mark.parametrize(
    ("body", "fits"),
    [
        ({"input": [1, 2, 3, 4, 5, 6]}, True),
        ({"input": [[1, 2, 3], [4, 5, 6]]}, True),
        ({"input": [1, 2, 3, 4, 5, 6, 7]}, False),
        ({"input": [[1, 2, 3], [4, 5, 6], [7]]}, False),
    ],
)
def test_token_ids_past_max_request_tokens_are_413(body: dict, fits: bool) -> None:
    build = embed(body)
    if fits:
        assert build()
    else:
        error = refused(build)
        assert (error.status_code, error.param, error.code) == (413, "input", "request_too_large")


# max_tokens ------------------------------------------------------------------------------


def chat(**fields: Any) -> ChatCompletionRequest:
    messages = [{"role": "user", "content": "hi"}]
    return msgspec.convert({"model": "m", "messages": messages, **fields}, ChatCompletionRequest)


def completion(**fields: Any) -> CompletionRequest:
    return msgspec.convert({"model": "m", "prompt": "hi", **fields}, CompletionRequest)


def generate(
    request: ChatCompletionRequest | CompletionRequest,
    context: int = CONTEXT,
    limits: GatewaySettings = LIMITS,
) -> list:
    return request.to_jobs(ENV, msgspec.structs.replace(GEN_SPEC, max_length=context), limits)


@pytest.mark.parametrize(
    ("request_", "param"),
    [
        (chat(max_tokens=51), "max_tokens"),
        (chat(max_completion_tokens=51), "max_completion_tokens"),
        (chat(max_tokens=10, max_completion_tokens=BIG), "max_completion_tokens"),
        (completion(max_tokens=51), "max_tokens"),
        (completion(max_tokens=BIG), "max_tokens"),
    ],
)
def test_max_tokens_past_the_gateway_cap_is_400_naming_the_field(request_, param: str) -> None:
    error = refused(lambda: generate(request_))
    assert (error.status_code, error.param, error.code) == (400, param, "max_tokens_too_large")


@pytest.mark.parametrize(
    ("request_", "param"),
    [
        (chat(max_completion_tokens=50), "max_completion_tokens"),
        (chat(max_tokens=50), "max_tokens"),
        (completion(max_tokens=50), "max_tokens"),
    ],
)
def test_max_tokens_past_the_context_names_the_field(request_, param: str) -> None:
    error = refused(lambda: generate(request_, context=40))
    assert (error.status_code, error.param) == (400, param)
    assert "context of 40" in error.message


def test_max_tokens_within_the_cap_is_sent() -> None:
    assert generate(chat(max_completion_tokens=50))[0].sampling.max_tokens == 50
    assert generate(chat())[0].sampling.max_tokens == 0  # unset: up to the context
    assert generate(completion(max_tokens=50))[0].sampling.max_tokens == 50


# Ints past 64 bits -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "body", "where"),
    [
        (EmbeddingRequest, {"model": "m", "input": [BIG]}, "$.input[0]"),
        (EmbeddingRequest, {"model": "m", "input": [2**64 - 1]}, "$.input[0]"),
        (EmbeddingRequest, {"model": "m", "input": [[101, -BIG]]}, "$.input[0][1]"),
        (EmbeddingRequest, {"model": "m", "input": [-1]}, "$.input[0]"),
        (
            ChatCompletionRequest,
            {"model": "m", "messages": [{"role": "user"}], "seed": BIG},
            "$.seed",
        ),
        (CompletionRequest, {"model": "m", "prompt": "a", "seed": -(2**63) - 1}, "$.seed"),
        (ClassifyRequest, {"model": "m", "input": "a", "top_k": BIG}, "$.top_k"),
    ],
)
def test_ints_that_would_not_fit_a_queue_message_are_invalid(kind, body, where: str) -> None:
    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.json.decode(msgspec.json.encode(body), type=kind)
    assert str(info.value).endswith(f"at `{where}`")


def test_the_int64_seed_range_is_accepted() -> None:
    for seed in (2**63 - 1, -(2**63)):
        body = {"model": "m", "prompt": "a", "seed": seed}
        assert msgspec.convert(body, CompletionRequest).seed == seed


@pytest.mark.parametrize(
    "fields",
    [{"max_length": BIG}, {"dims": BIG}, {"stride": BIG}, {"profile": {"max_batch_tokens": BIG}}],
)
def test_a_model_spec_with_a_huge_size_is_invalid(fields: dict) -> None:
    body = {"id": "m", "tasks": ["embed"], "source": "x", "max_length": 8, "dims": 4, **fields}
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(body, ModelSpec)


def test_embed_options_name_the_native_field() -> None:
    assert EmbedOptions().input_param == "input"
    assert NativeEmbedRequest(model="m", inputs=["a"]).options().input_param == "inputs"
