"""Shoal's SGLang runtime, end to end, against a TEST DOUBLE of SGLang's server.

sglang cannot be installed on these machines (see tests/doubles/sglang_server.py), so the
generation worker supervises the double instead, started through the same configurable
command a deployment points at its SGLang environment. What is checked is Shoal's side:
the requests it sends, how it reads SGLang's streams, aborts, restarts and LoRA loading.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers import (
    model_ready,
    start_gateway,
    start_worker,
    stream_chat_broken_midway,
    wait_until,
)

pytestmark = pytest.mark.slow

MODEL = "sglang-double"
DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "sglang_server.py"
QUESTION = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture(scope="module")
def double_stack(tmp_path_factory, lm_dir):
    root = tmp_path_factory.mktemp("sglang")
    model_dir = root / "model"  # the tokenizer and config SGLang would load (no weights)
    model_dir.mkdir()
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
    ):
        if (lm_dir / name).exists():
            shutil.copy(lm_dir / name, model_dir / name)
    spec = root / "models.toml"
    spec.write_text(
        f'[[models]]\nid = "{MODEL}"\ntasks = ["generate"]\nruntime = "sglang"\n'
        f'source = "{model_dir}"\nmax_length = 2048\n'
        "[models.profile]\nmax_batch_items = 8\n"
    )
    from shoal.queue.embedded import EmbeddedNats

    nats = EmbeddedNats(root / "nats").start()
    env = {
        "SHOAL_MODELS_FILE": str(spec),
        "SHOAL_GENERATOR__SGLANG_COMMAND": f"{sys.executable},{DOUBLE}",
        "SHOAL_NATS__ACK_WAIT": "5",
        "SHOAL_LOG_LEVEL": "info",
    }
    worker = start_worker(nats.url, root, models=MODEL, extra=env, name="gen", kind="generate")
    gateway, base = start_gateway(
        nats.url, root, {**env, "SHOAL_GATEWAY__NO_WORKER_POLICY": "queue"}
    )
    try:
        wait_until(lambda: model_ready(base, MODEL), 120, worker, "SGLang runtime")
        yield base, worker, model_dir
    finally:
        gateway.stop()
        worker.stop()
        nats.stop()


def _double_url(worker) -> str:
    ports = re.findall(r"--port (\d+)", worker.log_path.read_text(errors="replace"))
    return f"http://127.0.0.1:{ports[-1]}"


def _double(worker) -> dict:
    return httpx.get(f"{_double_url(worker)}/double/stats", timeout=5).json()


def test_chat_through_sglang_sends_what_shoal_means_and_reads_the_stream(double_stack):
    base, worker, model_dir = double_stack
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=12,
        temperature=0.7,
        top_p=0.9,
        seed=42,
        frequency_penalty=0.5,
    )
    text = r.choices[0].message.content
    assert len(text.split()) == 12 and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12
    sent = _double(worker)["requests"][-1]["sampling_params"]
    assert sent == {
        "max_new_tokens": 12,
        "temperature": 0.7,
        "top_p": 0.9,
        "frequency_penalty": 0.5,
        "presence_penalty": 0.0,
        "sampling_seed": 42,
    }
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
        QUESTION, add_generation_prompt=True, tokenize=True
    )
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    assert r.usage.prompt_tokens == len(prompt)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=12,
        temperature=0.7,
        top_p=0.9,
        seed=42,
        frequency_penalty=0.5,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text


def test_stop_logprobs_n_and_json_schema_are_passed_and_mapped(double_stack) -> None:
    base, worker, _ = double_stack
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    free = (
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, seed=1)
        .choices[0]
        .message.content
    )
    stop_word = free.split()[3]
    r = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=20,
        seed=1,
        stop=[stop_word],
        logprobs=True,
        top_logprobs=1,
    )
    assert stop_word not in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens
    n = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=5, n=2, seed=9, temperature=1.0
    )
    assert len(n.choices) == 2
    seeds = [q["sampling_params"]["sampling_seed"] for q in _double(worker)["requests"][-2:]]
    assert sorted(seeds) == [9, 10]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=5,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    )
    assert json.loads(_double(worker)["requests"][-1]["sampling_params"]["json_schema"]) == schema


def test_a_client_that_leaves_aborts_the_sglang_request(double_stack) -> None:
    base, worker, _ = double_stack
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 5:
                break
    rid = _double(worker)["requests"][-1]["rid"]
    wait_until(lambda: rid in _double(worker)["aborted"], 15, worker, "abort_request")


def test_a_crashed_sglang_server_is_restarted_and_the_stream_completes(double_stack) -> None:
    base, worker, _ = double_stack
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 80, "seed": 5}
    want = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60).json()
    want = want["choices"][0]["message"]["content"]
    before = _double(worker)["pid"]

    def crash() -> None:
        with pytest.raises(httpx.HTTPError):
            httpx.post(f"{_double_url(worker)}/double/crash", timeout=2)

    text, _ = stream_chat_broken_midway(base, body, 8, crash, timeout=120)
    assert text == want
    deadline = time.monotonic() + 30
    while _double(worker)["pid"] == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _double(worker)["pid"] != before


def test_a_lora_adapter_is_loaded_into_sglang_and_selected_by_name(double_stack):
    base, worker, model_dir = double_stack
    # Registered adapters lie under a model root: the default one, data_dir/models.
    adapter_dir = model_dir.parent / "models" / "adapter"
    adapter_dir.mkdir(parents=True)
    (adapter_dir / "adapter_config.json").write_text("{}")
    r = httpx.post(
        f"{base}/admin/v1/models/{MODEL}/adapters",
        json={"name": "sea-v2", "source": str(adapter_dir)},
    )
    assert r.status_code == 201, r.text
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    common = {"messages": QUESTION, "max_tokens": 8, "seed": 3}
    tuned = client.chat.completions.create(model=f"{MODEL}:sea-v2", **common)
    plain = client.chat.completions.create(model=MODEL, **common)
    assert tuned.choices[0].message.content != plain.choices[0].message.content
    stats = _double(worker)
    assert stats["loras"] == {"sea-v2": str(adapter_dir)}
    assert stats["requests"][-2]["lora_path"] == "sea-v2"
    assert stats["requests"][-1]["lora_path"] == ""
