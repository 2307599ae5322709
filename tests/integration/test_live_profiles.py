"""Batching profiles changed at run time (`LiveRegistry.set_profile`, as `shoal tune`
does): every registry on the bucket sees the override, and a running encoder worker
batches by it without a restart."""

from __future__ import annotations

import asyncio
import logging

import msgspec
import pytest
import torch

from shoal.model_registry import (
    BatchProfile,
    LiveRegistry,
    ModelRegistry,
    UnknownModelError,
)
from shoal.queue import Bus
from shoal.workers.adapters.dummy import DummyAdapter
from shoal.workers.encoder.worker import EncoderWorker
from tests.integration.test_queue_semantics import SPEC, Harness, _until, settings_for
from tests.unit.model_registry.test_live_registry import MemoryStore, spec

SMALL = BatchProfile(max_batch_tokens=512, max_batch_items=2, max_wait_ms=2.0, threads=1)


# Override semantics, over the in-memory store -------------------------------------------


async def test_an_override_replaces_a_spec_file_profile_until_cleared() -> None:
    store = MemoryStore()
    static = ModelRegistry([spec("builtin", aliases=["alias"])])
    tuner, worker = LiveRegistry(static, store), LiveRegistry(static, store)
    await tuner.start()
    await worker.start()

    await tuner.set_profile("alias", SMALL)
    for registry in (tuner, worker):
        assert registry.resolve("builtin").profile == SMALL
        assert [s.profile for s in registry] == [SMALL]
    await tuner.clear_profile("builtin")
    assert worker.resolve("builtin").profile == BatchProfile()
    with pytest.raises(UnknownModelError):
        await tuner.set_profile("nope", SMALL)
    with pytest.raises(UnknownModelError):
        await tuner.clear_profile("nope")


async def test_a_registration_delivered_after_its_override_gets_it() -> None:
    store = MemoryStore()
    static = ModelRegistry([spec("builtin")])
    admin = LiveRegistry(static, store)
    await admin.start()
    await admin.register_model(spec("fresh"))
    await admin.set_profile("fresh", SMALL)
    # A process starting now is delivered the override before the registration.
    store.data = dict(reversed(store.data.items()))
    restarted = LiveRegistry(static, store)
    await restarted.start()
    assert restarted.resolve("fresh").profile == SMALL

    await admin.remove_model("fresh")  # its override goes with it
    await admin.register_model(spec("fresh"))
    assert restarted.resolve("fresh").profile == BatchProfile()


# Against a real nats-server ----------------------------------------------------------------


async def _live_registry(bus: Bus) -> LiveRegistry:
    bucket = settings_for("").nats.registry_bucket
    registry = LiveRegistry(ModelRegistry([SPEC]), await bus.key_value(bucket))
    await registry.start()
    return registry


async def test_an_override_reaches_another_registry_on_the_bucket(nats_server) -> None:
    nats = settings_for(nats_server.url).nats
    buses = [await Bus.connect(nats, f"test-{i}") for i in range(2)]
    try:
        tuner, other = [await _live_registry(bus) for bus in buses]
        await tuner.set_profile(SPEC.id, SMALL)
        await _until(lambda: other.resolve(SPEC.id).profile == SMALL)
        await tuner.clear_profile(SPEC.id)
        await _until(lambda: other.resolve(SPEC.id).profile == SPEC.profile)
        with pytest.raises(UnknownModelError):
            await tuner.set_profile("no/such-model", SMALL)
    finally:
        for bus in buses:
            await bus.close()


class ThreadsAdapter(DummyAdapter):
    """Records the torch threads each forward pass runs on (batch sizes: `batches`)."""

    def __init__(self, spec) -> None:
        super().__init__(spec)
        self.threads: list[int] = []

    def embed(self, batch):
        self.threads.append(torch.get_num_threads())
        return super().embed(batch)


async def _start_worker(h: Harness, adapter: DummyAdapter) -> EncoderWorker:
    """A worker whose registry follows the bucket (Harness.add_worker's does not)."""
    bus = await Bus.connect(h.settings.nats, "test-worker")
    worker = EncoderWorker(
        h.settings, bus, await _live_registry(bus), [adapter], payloads=h.payloads
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await _until(lambda: worker.state == "ready" or task.done())
    assert not task.done()
    h.workers.append((worker, stop, task))
    return worker


async def test_a_running_worker_batches_by_a_profile_set_elsewhere(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="shoal.workers.encoder.worker")
    adapter = ThreadsAdapter(SPEC)
    await _start_worker(harness, adapter)
    tuner = await _live_registry(harness.bus)
    full_threads = torch.get_num_threads()

    async def burst() -> tuple[list[int], list[int]]:
        """Batch sizes and threads of the forward passes a burst of requests ran."""
        done = len(adapter.batches)
        texts = [[f"request {i} word {j}" for j in range(i % 3 + 1)] for i in range(120)]
        await asyncio.gather(*(harness.embed(t) for t in texts))
        return adapter.batches[done:], adapter.threads[done:]

    sizes, _ = await burst()
    assert max(sizes) > 2, sizes

    await tuner.set_profile(SPEC.id, SMALL)
    await _until(lambda: f"profile of {SPEC.id} now" in caplog.text)
    sizes, threads = await burst()
    assert max(sizes) <= 2, sizes
    assert set(threads) == {1}

    caplog.clear()
    await tuner.clear_profile(SPEC.id)
    await _until(lambda: f"profile of {SPEC.id} now" in caplog.text)
    sizes, threads = await burst()
    assert max(sizes) > 2, sizes
    assert set(threads) == {full_threads}
    assert "stopped serving" not in caplog.text  # the lane was never dropped


async def test_a_dtype_or_engine_change_waits_for_the_next_load(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="shoal.workers.encoder.worker")
    await _start_worker(harness, DummyAdapter(SPEC))
    tuner = await _live_registry(harness.bus)
    await tuner.set_profile(SPEC.id, msgspec.structs.replace(SPEC.profile, dtype="bfloat16"))
    await _until(lambda: "take effect when the model is next loaded" in caplog.text)
    assert (await harness.embed(["still served"])).shape == (1, 16)
    await tuner.set_profile(SPEC.id, msgspec.structs.replace(SPEC.profile, engine="openvino"))
    await _until(lambda: "engine openvino of" in caplog.text)
    assert (await harness.embed(["still served"])).shape == (1, 16)
