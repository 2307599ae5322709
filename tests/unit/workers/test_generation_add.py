"""A generation model that fails to load leaves no runtime behind: the registry follow
tries it again (core/following.py), and each try kept one more runtime before."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from shoal.config import Settings
from shoal.model_registry import BatchProfile, LiveRegistry, ModelRegistry, ModelSpec
from shoal.workers.generation.worker import GenerationKind


@pytest.mark.parametrize("engine", ["torch", "auto"])
async def test_a_model_that_fails_to_load_keeps_no_runtime(tmp_path: Path, engine: str) -> None:
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    spec = ModelSpec(
        id="broken",
        tasks=["generate"],
        runtime="transformers",
        source=str(empty),
        max_length=64,
        profile=BatchProfile(engine=engine),
    )
    kind = GenerationKind(Settings(data_dir=tmp_path / "data"))
    # The worker core needs NATS; all add_model asks of it is the registry.
    kind.attach(SimpleNamespace(registry=LiveRegistry(ModelRegistry([spec]))))  # type: ignore[arg-type]
    try:
        for _ in range(3):  # as the registry follow retries it
            with pytest.raises((OSError, ValueError)):  # transformers: no model there
                await kind.add_model(spec)
        # "auto" tried the OpenVINO engine, then the transformers engine: neither is kept
        assert kind._runtimes == [] and kind.models == {}
    finally:
        await kind.stop()
