"""Traces, metrics and the status page, on a stack of its own (real nats-server, gateway,
encoder and generation workers) whose processes export spans to a real OTLP/HTTP receiver
and serve Prometheus text."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from shoal.queue.embedded import EmbeddedNats, free_port
from tests.helpers import (
    GEN_MODEL,
    MODEL,
    ShoalProcess,
    metric_samples,
    metric_value,
    model_ready,
    start_gateway,
    start_worker,
    wait_until,
)
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.slow


class Observed:
    def __init__(self, base: str, receiver: OtlpReceiver, worker_metrics: str, gen_metrics: str):
        self.base = base
        self.receiver = receiver
        self.worker_metrics = worker_metrics
        self.gen_metrics = gen_metrics
        self.oai = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def observed(
    lm_dir: Path, session_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Observed]:
    """`lm_dir` first: the generation worker reuses the session's converted SmolLM2 (its
    data dir is the session's; everything else here is its own)."""
    tmp = tmp_path_factory.mktemp("observed")
    nats = EmbeddedNats(tmp / "nats").start(log_file=tmp / "nats-server.log")
    receiver = OtlpReceiver()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # ms: spans reach the receiver quickly
    }
    worker_port, gen_port = free_port(), free_port()
    procs: list[ShoalProcess] = []
    try:
        worker = start_worker(
            nats.url,
            session_dir,
            models=MODEL,
            extra={**env, "SHOAL_TELEMETRY__METRICS_PORT": str(worker_port)},
            name="observed-worker",
        )
        procs.append(worker)
        generator = start_worker(
            nats.url,
            session_dir,
            models=GEN_MODEL,
            extra={**env, "SHOAL_TELEMETRY__METRICS_PORT": str(gen_port)},
            name="observed-generator",
            kind="generate",
        )
        procs.append(generator)
        gateway, base = start_gateway(nats.url, tmp, env)
        procs.append(gateway)
        wait_until(lambda: model_ready(base, MODEL), 120, worker, "the encoder worker")
        wait_until(lambda: model_ready(base, GEN_MODEL), 240, generator, "the generator")
        yield Observed(
            base,
            receiver,
            f"http://127.0.0.1:{worker_port}/metrics",
            f"http://127.0.0.1:{gen_port}/metrics",
        )
    finally:
        for proc in reversed(procs):
            proc.stop()
        receiver.close()
        nats.stop()


def test_ready_workers_answer_their_probes(observed: Observed) -> None:
    for metrics in (observed.worker_metrics, observed.gen_metrics):
        base = metrics.removesuffix("/metrics")
        assert httpx.get(f"{base}/health", timeout=10).status_code == 200
        assert httpx.get(f"{base}/ready", timeout=10).status_code == 200


def _trace_of(receiver: OtlpReceiver, request_id: str, names: set[str]) -> list[ReceivedSpan]:
    """The spans of the trace whose gateway span names `request_id`, once `names` are in."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        roots = [s for s in receiver.spans if s.attributes.get("shoal.request_id") == request_id]
        if roots:
            spans = receiver.trace(roots[0].trace_id)
            if names <= {s.name for s in spans}:
                return spans
        time.sleep(0.2)
    seen = sorted({(s.service, s.name) for s in receiver.spans})
    raise AssertionError(f"no complete trace for {request_id}; spans seen: {seen}")


def _request_id(observed: Observed, path: str, body: dict) -> str:
    """Send one request; its request id as the gateway's span recorded it."""
    before = len(observed.receiver.spans)
    r = httpx.post(f"{observed.base}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for span in observed.receiver.spans[before:]:
            if span.kind == 2 and span.attributes.get("http.route") == path:  # SERVER
                return span.attributes["shoal.request_id"]
        time.sleep(0.2)
    raise AssertionError(f"no gateway span for {path}")


def test_one_embeddings_request_is_one_trace_across_gateway_and_worker(observed) -> None:
    request_id = _request_id(
        observed, "/v1/embeddings", {"model": MODEL, "input": ["a trace", "of two"]}
    )
    stages = {"shoal.tokenize", "shoal.batch.wait", "shoal.forward", "shoal.result.publish"}
    spans = _trace_of(observed.receiver, request_id, {"shoal.worker.job", *stages})
    by_name = {s.name: s for s in spans}
    [gateway] = [s for s in spans if s.kind == 2]
    assert gateway.service == "shoal-gateway" and gateway.parent_id == ""
    assert gateway.attributes["http.response.status_code"] == 200
    assert gateway.attributes["shoal.model"] == MODEL
    job, wait = by_name["shoal.worker.job"], by_name["shoal.queue.wait"]
    assert job.service == wait.service == "shoal-worker"
    assert job.parent_id == wait.parent_id == gateway.span_id  # across the NATS hop
    for name in stages:
        stage = by_name[name]
        assert stage.parent_id == job.span_id, name
        assert job.start_ns <= stage.start_ns <= stage.end_ns <= job.end_ns, name
    forward = by_name["shoal.forward"]
    assert forward.attributes["shoal.inputs"] == 2
    assert forward.attributes["shoal.tokens"] > 2
    assert forward.attributes["shoal.batch.size"] >= 2  # its two inputs ran together
    assert forward.attributes["shoal.batch.tokens"] >= forward.attributes["shoal.tokens"]
    assert wait.end_ns <= job.start_ns + 1_000_000  # the queue wait ends at the pull
    assert gateway.start_ns <= wait.start_ns and job.end_ns <= gateway.end_ns + 50_000_000


def test_a_chat_request_traces_first_token_and_decode(observed) -> None:
    body = {"model": GEN_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    request_id = _request_id(observed, "/v1/chat/completions", body)
    names = {"shoal.worker.job", "shoal.generate.first_token", "shoal.generate.decode"}
    spans = _trace_of(observed.receiver, request_id, names)
    by_name = {s.name: s for s in spans}
    [gateway] = [s for s in spans if s.kind == 2]
    job = by_name["shoal.worker.job"]
    assert job.service == "shoal-generator" and job.parent_id == gateway.span_id
    first, decode = by_name["shoal.generate.first_token"], by_name["shoal.generate.decode"]
    assert first.parent_id == decode.parent_id == job.span_id
    assert first.end_ns == decode.start_ns
    assert 1 <= decode.attributes["shoal.completion_tokens"] <= 8


def test_metrics_count_the_traffic_sent(observed) -> None:
    route = {"route": "/v1/embeddings", "model": MODEL}
    gateway_url = f"{observed.base}/metrics"
    before = metric_samples(gateway_url)
    worker_before = metric_samples(observed.worker_metrics)
    texts = [[f"text {i}-{j}" for j in range(i + 1)] for i in range(5)]  # 15 inputs
    for batch in texts:
        observed.oai.embeddings.create(model=MODEL, input=batch)
    for _ in range(2):
        with pytest.raises(openai.NotFoundError):
            observed.oai.embeddings.create(model="no-such-model", input="x")

    requests = "shoal_gateway_request_duration_seconds_count"  # the histogram counts them

    def answered(samples: dict, **labels: str) -> float:
        return metric_value(samples, requests, **labels) - metric_value(before, requests, **labels)

    # The count lands as the response's last byte goes out: wait for it.
    wait_until(
        lambda: answered(metric_samples(gateway_url), status="200", **route) == 5,
        10,
        None,
        "the gateway's request count",
    )
    after = metric_samples(gateway_url)
    assert answered(after, route="/v1/embeddings", model="", status="404") == 2
    assert (
        metric_value(after, "shoal_gateway_request_duration_seconds_sum", status="200", **route) > 0
    )
    assert ("shoal_queue_pending", frozenset()) not in after  # labelled by subject
    assert any(n == "shoal_queue_pending" and ("model", MODEL) in lab for n, lab in after)
    assert metric_value(after, "shoal_workers_live") == 2
    assert metric_value(after, "process_resident_memory_bytes") > 0

    worker = metric_samples(observed.worker_metrics)
    labels = {"model": MODEL, "op": "embed"}

    def grew(name: str) -> float:
        return metric_value(worker, name, **labels) - metric_value(worker_before, name, **labels)

    assert grew("shoal_worker_inputs_total") == 15
    assert grew("shoal_worker_batch_size_sum") == 15  # every input ran in some batch
    batches = grew("shoal_worker_batch_size_count")
    assert 1 <= batches <= 5
    assert grew("shoal_worker_forward_duration_seconds_count") == batches
    assert grew("shoal_worker_tokens_total") >= grew("shoal_worker_inputs_total")
    assert metric_value(worker, "shoal_worker_resident_memory_bytes") > 0
    assert metric_value(worker, "shoal_worker_model_loads_total") >= 1


def test_generation_metrics_time_first_tokens_and_the_gaps_between(observed) -> None:
    before = metric_samples(observed.gen_metrics)
    for content in ("Hello", "Name a colour"):
        observed.oai.chat.completions.create(
            model=GEN_MODEL, messages=[{"role": "user", "content": content}], max_tokens=6
        )
    after = metric_samples(observed.gen_metrics)
    labels = {"model": GEN_MODEL}

    def grew(name: str) -> float:
        return metric_value(after, name, **labels) - metric_value(before, name, **labels)

    assert grew("shoal_generation_time_to_first_token_seconds_count") == 2
    assert grew("shoal_generation_time_to_first_token_seconds_sum") > 0
    assert grew("shoal_generation_inter_token_latency_seconds_count") >= 2
    assert 2 <= grew("shoal_worker_tokens_total") <= 12


CHROMIUM = "/usr/bin/chromium"  # Debian's package; the Makefile's set-up installs it
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_ARGS = [  # no sandbox as root; no background calls out of this closed network
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def test_the_status_page_shows_models_and_traffic_live(observed) -> None:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "install Debian's chromium (make setup does)"
    observed.oai.embeddings.create(model=MODEL, input="before the page opens")
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on(
                "console",
                lambda m: (
                    problems.append(f"{m.type}: {m.text}")
                    if m.type in ("error", "warning")
                    else None
                ),
            )
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            page.goto(f"{observed.base}/status")
            page.wait_for_function("document.getElementById('state').textContent === 'live'")
            total = int(page.text_content("#total-requests") or "0")
            assert total >= 1
            names = page.locator("#models .model-name").all_text_contents()
            assert MODEL in names and GEN_MODEL in names, names
            workers = page.locator("#workers .worker-id").all_text_contents()
            assert len(workers) == 2, workers
            assert page.locator("svg.sparkline").count() >= 3
            observed.oai.embeddings.create(model=MODEL, input="while the page is open")
            page.wait_for_function(  # it refreshes itself: no reload
                f"Number(document.getElementById('total-requests').textContent) > {total}",
                timeout=15_000,
            )
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "status-page.png"), full_page=True)
        finally:
            browser.close()
    assert problems == []
