"""Tokenize and detokenize through the session stack: vLLM's `/tokenize` and
`/detokenize`, TEI's `/tokenize` and `/decode` under a model's TEI base URL. Answers are
checked against the models' own tokenizers in process, and a chat's count against the
prompt tokens a chat completion with the same messages reports."""

from __future__ import annotations

import httpx
import pytest
from transformers import AutoTokenizer

from tests.helpers import GEN_MODEL, MODEL

pytestmark = pytest.mark.slow

PROMPT = "Shoal serves fleets of small models, naïvely fast."
CHAT = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "What colour is the sky?"},
]


@pytest.fixture(scope="module")
def http(stack: str):
    with httpx.Client(base_url=stack, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def lm_tokenizer(lm_dir):
    return AutoTokenizer.from_pretrained(str(lm_dir))


def test_vllm_tokenize_a_prompt_and_back(http, lm_tokenizer) -> None:
    got = http.post(
        "/tokenize", json={"model": GEN_MODEL, "prompt": PROMPT, "return_token_strs": True}
    )
    assert got.status_code == 200, got.text
    body = got.json()
    want = lm_tokenizer(PROMPT)["input_ids"]
    assert body["tokens"] == want and body["count"] == len(want)
    assert body["token_strs"] == lm_tokenizer.convert_ids_to_tokens(want)
    assert body["max_model_len"] == 2048  # the built-in spec's max_length
    back = http.post("/detokenize", json={"model": GEN_MODEL, "tokens": body["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": PROMPT}
    plain = http.post("/tokenize", json={"model": GEN_MODEL, "prompt": PROMPT}).json()
    assert plain["token_strs"] is None and plain["tokens"] == want


def test_vllm_tokenize_a_chat_counts_what_the_chat_completion_is_given(http, lm_tokenizer) -> None:
    got = http.post("/tokenize", json={"model": GEN_MODEL, "messages": CHAT}).json()
    want = lm_tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert got["tokens"] == list(want)
    chat = http.post(
        "/v1/chat/completions",
        json={"model": GEN_MODEL, "messages": CHAT, "max_tokens": 1, "temperature": 0},
    ).json()
    assert chat["usage"]["prompt_tokens"] == got["count"]


def test_tokenize_serves_encoder_models_too(http) -> None:
    """Any model tokenizes, whatever its tasks; the text is not cut to its limit."""
    long_text = "word " * 400
    got = http.post("/tokenize", json={"model": MODEL, "prompt": long_text}).json()
    assert got["count"] == 402 and got["max_model_len"] == 256  # [CLS] + 400 + [SEP]


def test_vllm_tokenize_refuses_what_it_cannot_serve(http) -> None:
    both = http.post("/tokenize", json={"model": GEN_MODEL, "prompt": "a", "messages": CHAT})
    assert both.status_code == 400 and both.json()["error"]["param"] == "prompt"
    cont = {"model": GEN_MODEL, "messages": CHAT, "add_generation_prompt": False}
    refused = http.post("/tokenize", json=cont)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "add_generation_prompt"
    outside = http.post("/detokenize", json={"model": GEN_MODEL, "tokens": [1, 10**9]})
    assert (
        outside.status_code == 400 and "token ids must be in" in outside.json()["error"]["message"]
    )
    unknown = http.post("/tokenize", json={"model": "no-such-model", "prompt": "a"})
    assert unknown.status_code == 404


def test_tei_tokenize_and_decode(http, st_model) -> None:
    texts = [PROMPT, "John lives in New York."]
    got = http.post(f"/tei/{MODEL}/tokenize", json={"inputs": texts})
    assert got.status_code == 200, got.text
    rows = got.json()
    for text, row in zip(texts, rows, strict=True):
        enc = st_model.tokenizer(text, return_offsets_mapping=True)
        assert [t["id"] for t in row] == enc["input_ids"]
        assert [t["special"] for t in row] == [True, *[False] * (len(row) - 2), True]
        assert row[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
        for token, (start, stop) in zip(row[1:-1], enc["offset_mapping"][1:-1], strict=True):
            assert (token["start"], token["stop"]) == (start, stop)
            assert token["text"] == text[start:stop]
    one = http.post(
        f"/tei/{MODEL}/tokenize", json={"inputs": texts[1], "add_special_tokens": False}
    ).json()
    assert len(one) == 1 and [t["id"] for t in one[0]] == [t["id"] for t in rows[1][1:-1]]

    ids = [t["id"] for t in rows[1]]
    decoded = http.post(f"/tei/{MODEL}/decode", json={"ids": ids}).json()
    assert decoded == [st_model.tokenizer.decode(ids, skip_special_tokens=True)]
    both = http.post(
        f"/tei/{MODEL}/decode", json={"ids": [ids, ids[:3]], "skip_special_tokens": False}
    ).json()
    assert both == [st_model.tokenizer.decode(i) for i in (ids, ids[:3])]


def test_tei_tokenize_errors_are_tei_shaped(http) -> None:
    for path, body, param in (
        ("tokenize", {"inputs": []}, "inputs"),
        ("tokenize", {"inputs": "a", "prompt_name": "query"}, "prompt_name"),
        ("decode", {"ids": []}, "ids"),
        ("decode", {"ids": [1, [2]]}, "ids"),
        ("decode", {"ids": [10**9]}, "ids"),
    ):
        got = http.post(f"/tei/{MODEL}/{path}", json=body)
        assert got.status_code == 422, (path, body, got.text)
        assert got.json()["error_type"] == "Validation", param
