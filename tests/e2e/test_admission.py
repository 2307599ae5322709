"""Admission: API keys, permissions, per-key rate limits and the in-flight bound, through the official openai SDK against
a real gateway (keys given as settings, the way an operator gives them) on the shared
stack's NATS and workers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from shoal.api.keys import hash_key
from shoal.queue.embedded import EmbeddedNats, free_port
from tests.e2e.test_batches import embed_lines, output_lines, submit, wait_batch
from tests.helpers import (
    GEN_MODEL,
    MODEL,
    ShoalProcess,
    hears_of,
    metric_samples,
    metric_value,
    shoal_env,
    start_gateway,
    wait_until,
)
from tests.openai_schema import validate

pytestmark = pytest.mark.slow

KEYS = {
    "root": "sk-shoal-test-root-0123456789",
    "embedder": "sk-shoal-test-embedder-0123456789",
    "slow": "sk-shoal-test-slow-0123456789",
    "frugal": "sk-shoal-test-frugal-0123456789",
    "batcher": "sk-shoal-test-batcher-0123456789",
    "filer": "sk-shoal-test-filer-0123456789",
    "metered": "sk-shoal-test-metered-0123456789",
}
ENTRIES = [
    {"name": "root", "sha256": hash_key(KEYS["root"]), "admin": True},
    {
        "name": "embedder",
        "sha256": hash_key(KEYS["embedder"]),
        "routes": ["embeddings", "models"],
        "models": [MODEL],
    },
    {"name": "slow", "sha256": hash_key(KEYS["slow"]), "rpm": 3},
    {"name": "frugal", "sha256": hash_key(KEYS["frugal"]), "tpm": 20},
    {
        "name": "batcher",
        "sha256": hash_key(KEYS["batcher"]),
        "routes": ["files", "batches", "embeddings"],
        "models": [MODEL],
    },
    {"name": "filer", "sha256": hash_key(KEYS["filer"]), "routes": ["files", "batches"]},
    {"name": "metered", "sha256": hash_key(KEYS["metered"]), "tpm": 40},
]


@pytest.fixture(scope="module")
def secured(
    stack: str,
    session_nats: EmbeddedNats,
    task_models: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, ShoalProcess]]:
    """A second gateway on the stack's NATS (so the stack's workers serve it) with keys
    from a keys file and from the environment, logging at debug."""
    data = tmp_path_factory.mktemp("secured")
    keys_file = data / "keys.json"
    keys_file.write_text(json.dumps(ENTRIES[2:]))
    env = {
        "SHOAL_AUTH__KEYS": json.dumps(ENTRIES[:2]),
        "SHOAL_AUTH__KEYS_FILE": str(keys_file),
        "SHOAL_LOG_LEVEL": "debug",
        "SHOAL_AUTH__RELOAD_SECONDS": "0.5",
        "SHOAL_MODELS_FILE": str(task_models),
        # Its own batches: the stack's gateway on the same NATS would otherwise claim them,
        # and it cannot read this gateway's uploads (each keeps files in its own data dir).
        "SHOAL_NATS__BATCHES_BUCKET": "SHOAL_BATCHES_SECURED",
    }
    gateway, base = start_gateway(session_nats.url, data, env)
    try:
        wait_until(lambda: hears_of(base, MODEL), 60, gateway, f"{MODEL} on the secured gateway")
        yield base, gateway
    finally:
        gateway.stop()


def _keys_file(gateway: ShoalProcess) -> Path:
    return Path(gateway.log_path).parent / "keys.json"


def _status(base: str, key: str | None = None) -> int:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{base}/v1/models", headers=headers).status_code


def client(base: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)


def error_of(exc: openai.APIStatusError) -> dict:
    body = exc.response.json()
    validate(body, "ErrorResponse")
    return body["error"]


def test_a_missing_or_unknown_key_is_401(secured) -> None:
    base, _ = secured
    r = httpx.post(f"{base}/v1/embeddings", json={"model": MODEL, "input": "x"})
    assert r.status_code == 401, r.text
    validate(r.json(), "ErrorResponse")
    assert r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError) as caught:
        client(base, "sk-shoal-not-a-key").embeddings.create(model=MODEL, input="x")
    assert error_of(caught.value)["code"] == "invalid_api_key"
    assert httpx.get(f"{base}/health").status_code == 200  # health stays public


def test_a_known_key_embeds(secured) -> None:
    base, _ = secured
    out = client(base, KEYS["root"]).embeddings.create(model=MODEL, input=["a", "b"])
    assert len(out.data) == 2 and len(out.data[0].embedding) == 384
    assert out.usage.prompt_tokens > 0


def test_a_key_calls_only_its_routes_and_models(secured) -> None:
    base, _ = secured
    embedder = client(base, KEYS["embedder"])
    assert embedder.embeddings.create(model=MODEL, input="fine").data
    with pytest.raises(openai.PermissionDeniedError) as caught:
        embedder.chat.completions.create(
            model=GEN_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    assert error_of(caught.value)["code"] == "permission_denied"
    with pytest.raises(openai.PermissionDeniedError) as caught:
        embedder.embeddings.create(model="test-colbert", input="not this model")
    error = error_of(caught.value)
    assert (error["code"], error["param"]) == ("model_not_allowed", "model")
    assert [m.id for m in embedder.models.list().data] == [MODEL]
    # An unknown model's error suggests only what this key may use.
    with pytest.raises(openai.NotFoundError) as caught:
        embedder.embeddings.create(model="no-such-model", input="x")
    message = error_of(caught.value)["message"]
    assert f"served: '{MODEL}' (GET /v1/models" in message and "colbert" not in message
    everything = {m.id for m in client(base, KEYS["root"]).models.list().data}
    assert {MODEL, GEN_MODEL, "test-colbert"} <= everything


def test_admin_routes_need_an_admin_key(secured) -> None:
    base, _ = secured

    def models(key: str) -> httpx.Response:
        return httpx.get(f"{base}/admin/v1/models", headers={"authorization": f"Bearer {key}"})

    denied = models(KEYS["embedder"])
    assert denied.status_code == 403, denied.text
    validate(denied.json(), "ErrorResponse")
    assert models(KEYS["slow"]).status_code == 403  # every route but admin is not admin
    assert models(KEYS["root"]).status_code == 200


def test_requests_per_minute_are_limited_with_openai_headers(secured) -> None:
    base, _ = secured
    slow = client(base, KEYS["slow"])
    remaining = []
    for _ in range(3):
        raw = slow.embeddings.with_raw_response.create(model=MODEL, input="count me")
        assert raw.headers["x-ratelimit-limit-requests"] == "3"
        assert raw.headers["x-ratelimit-reset-requests"]
        remaining.append(int(raw.headers["x-ratelimit-remaining-requests"]))
    assert remaining == [2, 1, 0]
    counted_before = _rate_limited(base)
    with pytest.raises(openai.RateLimitError) as caught:
        slow.embeddings.create(model=MODEL, input="one too many")
    # Operators see it: the metric and the status page count it (the count lands as the
    # response's last byte goes out).
    wait_until(lambda: _rate_limited(base) == counted_before + 1, 5, None, "the count")
    error = error_of(caught.value)
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
    headers = caught.value.response.headers
    assert 1 <= int(headers["retry-after"]) <= 20  # a request refills every 20 s at 3/min
    assert headers["x-ratelimit-remaining-requests"] == "0"


def _rate_limited(base: str) -> float:
    """What `/metrics` and `/status.json` count as rate-limited requests (public routes)."""
    metric = metric_value(metric_samples(f"{base}/metrics"), "shoal_gateway_rate_limited_total")
    status = httpx.get(f"{base}/status.json", timeout=10).json()["totals"]["rate_limited"]
    assert metric == status
    return metric


def test_tokens_per_minute_count_what_requests_used(secured) -> None:
    base, _ = secured
    frugal = client(base, KEYS["frugal"])
    long_text = "tokens are counted after the fact " * 4
    first = frugal.embeddings.with_raw_response.create(model=MODEL, input=long_text)
    assert first.headers["x-ratelimit-limit-tokens"] == "20"
    assert first.parse().usage.prompt_tokens > 20  # this one used more than a minute's worth
    with pytest.raises(openai.RateLimitError) as caught:
        frugal.embeddings.create(model=MODEL, input="short")
    assert error_of(caught.value)["type"] == "tokens"
    assert int(caught.value.response.headers["retry-after"]) >= 1


def test_batch_lines_run_with_the_creating_keys_model_allowlist(secured, tmp_path) -> None:
    """Batch lines run later, outside any request: they still may use only the models
    of the key that created the batch (a line naming another fails the batch's
    validation, as any invalid line does)."""
    base, _ = secured
    batcher = client(base, KEYS["batcher"])

    def run(models: list[str]):
        lines = [
            json.dumps(
                {
                    "custom_id": f"line-{i}",
                    "method": "POST",
                    "url": "/v1/embeddings",
                    "body": {"model": model, "input": f"text {i}"},
                }
            )
            for i, model in enumerate(models)
        ]
        path = tmp_path / f"batch-{len(models)}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        with path.open("rb") as f:
            upload = batcher.files.create(file=f, purpose="batch")
        batch = batcher.batches.create(
            input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h"
        )
        return wait_batch(batcher, batch.id)

    refused = run([MODEL, "test-colbert", MODEL])
    assert refused.status == "failed", refused
    (error,) = refused.errors.data
    assert (error.line, error.param) == (2, "body.model")
    assert "may not use model 'test-colbert'" in error.message
    allowed = run([MODEL, MODEL])
    assert allowed.status == "completed", allowed
    assert allowed.request_counts.completed == 2


def test_a_batch_line_is_refused_a_route_group_its_key_may_not_call(secured) -> None:
    """A key for files and batches only gets 403 on /v1/embeddings, live or as a batch
    line: each line fails with the live call's error, none runs."""
    base, _ = secured
    filer = client(base, KEYS["filer"])
    with pytest.raises(openai.PermissionDeniedError) as live:
        filer.embeddings.create(model=MODEL, input="text")
    batch = submit(filer, embed_lines(3), "/v1/embeddings")
    done = wait_batch(filer, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (0, 3)
    failed = output_lines(filer, done.error_file_id)
    assert sorted(line["custom_id"] for line in failed) == ["e-0", "e-1", "e-2"]
    for line in failed:
        assert line["response"]["status_code"] == 403
        assert line["response"]["body"] == live.value.response.json()


def test_batch_lines_count_toward_the_keys_tokens_per_minute(secured) -> None:
    """A batch's tokens are charged to its key as live requests' are: after a batch that
    used more than a minute's allowance, the key's live requests wait for it to refill."""
    base, _ = secured
    metered = client(base, KEYS["metered"])
    metered.embeddings.create(model=MODEL, input="short")  # the allowance is there
    lines = embed_lines(2)
    for line in lines:
        line["body"]["input"] = "batch tokens are counted like live ones " * 3
    done = wait_batch(metered, submit(metered, lines, "/v1/embeddings").id)
    assert (done.status, done.request_counts.completed) == ("completed", 2), done
    with pytest.raises(openai.RateLimitError) as caught:
        metered.embeddings.create(model=MODEL, input="short")
    assert error_of(caught.value)["type"] == "tokens"


def test_keys_never_reach_the_log(secured) -> None:
    base, gateway = secured
    for key in KEYS.values():  # known and wrong keys, good and refused requests
        httpx.post(
            f"{base}/v1/embeddings",
            json={"model": MODEL, "input": "x"},
            headers={"authorization": f"Bearer {key}x"},
        )
    log = Path(gateway.log_path).read_text(errors="replace")
    assert "key slow over its requests limit" in log or "key frugal" in log  # it logs by name
    for key in KEYS.values():
        assert key not in log


def test_a_key_added_or_revoked_in_the_keys_file_counts_without_a_restart(secured) -> None:
    base, gateway = secured
    path = _keys_file(gateway)
    kept = path.read_text()
    temp = "sk-shoal-test-temp-0123456789"
    assert _status(base, temp) == 401
    path.write_text(json.dumps([*json.loads(kept), {"name": "temp", "sha256": hash_key(temp)}]))
    try:
        # Bound: a few of the gateway's 0.5 s re-reads.
        wait_until(lambda: _status(base, temp) == 200, 10, gateway, "the added key")
    finally:
        path.write_text(kept)
    wait_until(lambda: _status(base, temp) == 401, 10, gateway, "the key's revocation")
    assert _status(base, KEYS["slow"]) in (200, 429)  # the file's other keys still count
    assert "keys file changed" in gateway.log() and temp not in gateway.log()


def test_status_json_shows_error_messages_to_operators_only(secured) -> None:
    """Messages may name keys, server paths and sources: public callers get the codes."""
    base, _ = secured
    with pytest.raises(openai.PermissionDeniedError):
        client(base, KEYS["embedder"]).models.retrieve("test-colbert")
    public = httpx.get(f"{base}/status.json").json()["errors"]
    operator = httpx.get(
        f"{base}/status.json", headers={"authorization": f"Bearer {KEYS['root']}"}
    ).json()["errors"]
    assert public and len(public) == len(operator)
    assert all(e["message"] == "" for e in public)
    assert any("embedder" in e["message"] for e in operator)
    assert [e["code"] for e in public] == [e["code"] for e in operator]


def _refused_start(env: dict, *args: str) -> str:
    """What `shoal gateway` says when it refuses to start (exit status 2)."""
    refused = subprocess.run(
        [sys.executable, "-m", "shoal", "gateway", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr
    return refused.stderr


def test_a_key_name_given_twice_stops_the_start(tmp_path: Path, session_nats: EmbeddedNats) -> None:
    twice = [{"name": "a", "sha256": "1" * 64}, {"name": "a", "sha256": "2" * 64}]
    env = shoal_env(session_nats.url, tmp_path, {"SHOAL_AUTH__KEYS": json.dumps(twice)})
    assert "API key name 'a' is given twice" in _refused_start(env, "--port", str(free_port()))


def test_no_keys_serves_loopback_only(tmp_path: Path, session_nats: EmbeddedNats) -> None:
    env = shoal_env(session_nats.url, tmp_path)
    refused = _refused_start(env, "--host", "0.0.0.0", "--port", "1")
    assert "refusing to serve on 0.0.0.0 without API keys" in refused
    gateway, base = start_gateway(session_nats.url, tmp_path)
    try:
        assert "serving on loopback (127.0.0.1) only, unauthenticated" in gateway.log()
        assert httpx.get(f"{base}/v1/models").status_code == 200
    finally:
        gateway.stop()
    assert free_port()  # the refused start bound nothing


def test_a_gateway_holding_its_most_requests_answers_429_at_once(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """With no worker and the `queue` policy, requests wait in the gateway until their
    deadline: past `max_in_flight` of them it refuses new ones before reading a body."""
    env = {
        "SHOAL_GATEWAY__MAX_IN_FLIGHT": "2",
        "SHOAL_GATEWAY__NO_WORKER_POLICY": "queue",
        "SHOAL_GATEWAY__REQUEST_TIMEOUT": "6",
    }
    gateway, base = start_gateway(nats_server.url, tmp_path, env)
    body = {"model": MODEL, "input": "waits"}
    try:
        with ThreadPoolExecutor(2) as pool:
            held = [pool.submit(httpx.post, f"{base}/v1/embeddings", json=body, timeout=30)]
            held.append(pool.submit(httpx.post, f"{base}/v1/embeddings", json=body, timeout=30))
            time.sleep(1.5)
            started = time.monotonic()
            r = httpx.post(f"{base}/v1/embeddings", json=body, timeout=30)
            assert time.monotonic() - started < 1.0
            assert r.status_code == 429, r.text
            validate(r.json(), "ErrorResponse")
            assert r.json()["error"]["code"] == "gateway_busy"
            assert int(r.headers["retry-after"]) >= 1
            assert httpx.get(f"{base}/v1/models").status_code == 200  # not a work route
            assert [f.result().status_code for f in held] == [504, 504]
        assert httpx.post(f"{base}/v1/embeddings", json=body, timeout=30).status_code == 504
    finally:
        gateway.stop()


def test_a_gateway_bounds_the_body_bytes_it_holds(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """Requests held waiting hold their bodies: past `max_body_bytes_in_flight` of them
    (declared lengths; a body of unknown length counts as the largest allowed) new ones
    get 429 before their body is read, however few requests that is."""
    kib = 1024
    env = {
        "SHOAL_GATEWAY__MAX_BODY_BYTES": str(64 * kib),
        "SHOAL_GATEWAY__MAX_BODY_BYTES_IN_FLIGHT": str(100 * kib),
        "SHOAL_GATEWAY__NO_WORKER_POLICY": "queue",
        "SHOAL_GATEWAY__REQUEST_TIMEOUT": "8",
    }
    gateway, base = start_gateway(nats_server.url, tmp_path, env)

    def body(kibibytes: int) -> bytes:
        text = "x" * (kibibytes * kib - 64)
        return json.dumps({"model": MODEL, "input": text}).encode()

    def post(content, **headers) -> httpx.Response:
        headers = {"content-type": "application/json", **headers}
        return httpx.post(f"{base}/v1/embeddings", content=content, headers=headers, timeout=30)

    def held() -> int:
        return httpx.get(f"{base}/status.json", timeout=5).json()["gateway"]["body_bytes_in_flight"]

    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(post, body(60))
            wait_until(lambda: held() == len(body(60)), 10, gateway, "the first body held")
            refused = post(body(50))
            assert refused.status_code == 429, refused.text
            validate(refused.json(), "ErrorResponse")
            assert refused.json()["error"]["code"] == "gateway_busy"
            assert int(refused.headers["retry-after"]) >= 1
            unknown_length = post(iter([body(1)]))  # chunked: counted as 64 KiB
            assert unknown_length.status_code == 429, unknown_length.text
            fits = pool.submit(post, body(30))  # 60 + 30 KiB: admitted, and waits
            assert (first.result().status_code, fits.result().status_code) == (504, 504)
        assert held() == 0
        assert post(body(50)).status_code == 504  # room again once they ended
    finally:
        gateway.stop()


async def test_a_client_that_leaves_cancels_its_work(stack: str, session_nats) -> None:
    """The gateway notices the client hang up mid-request and tells workers (on the cancel
    subject) to drop the request, long before its deadline; the stack keeps serving."""
    import nats

    nc = await nats.connect(session_nats.url)
    cancels: list[str] = []

    async def on_cancel(msg) -> None:
        cancels.append(msg.data.decode())

    await nc.subscribe("shoal.cancel", cb=on_cancel)
    try:
        texts = [f"a long request the client gives up on, text {i}" for i in range(20000)]
        async with httpx.AsyncClient(base_url=stack, timeout=1.0) as client:
            with pytest.raises(httpx.ReadTimeout):  # hangs up after 1 s
                await client.post("/v1/embeddings", json={"model": MODEL, "input": texts})
        deadline = time.monotonic() + 10
        while not cancels:
            assert time.monotonic() < deadline, "no cancel announced"
            await asyncio.sleep(0.05)
    finally:
        await nc.close()
    async with httpx.AsyncClient(base_url=stack, timeout=60) as client:
        r = await client.post("/v1/embeddings", json={"model": MODEL, "input": "after"})
    assert r.status_code == 200, r.text
