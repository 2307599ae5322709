"""The live registry over an in-memory KeyValueStore (a fake of the Protocol that
shoal.queue.nats.NatsKeyValue implements over JetStream KV; the real one is exercised in
tests/e2e/test_registry.py)."""

from collections.abc import Callable

import pytest

from shoal.model_registry import (
    AdapterSpec,
    LiveRegistry,
    ModelRegistry,
    ModelSpec,
    RegistryConflictError,
    UnknownAdapterError,
    UnknownModelError,
)


class MemoryStore:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.watchers: list[Callable[[str, bytes | None], None]] = []

    async def put(self, key: str, value: bytes) -> None:
        self.data[key] = value
        for w in self.watchers:
            w(key, value)

    async def delete(self, key: str) -> None:
        self.data.pop(key, None)
        for w in self.watchers:
            w(key, None)

    async def watch(self, on_change) -> None:
        for key, value in self.data.items():
            on_change(key, value)
        self.watchers.append(on_change)


def spec(model_id: str, **kw) -> ModelSpec:
    return ModelSpec(id=model_id, tasks=["embed"], source="/x", dims=4, max_length=8, **kw)


async def test_registrations_reach_every_registry_on_the_store_and_survive_restarts() -> None:
    store = MemoryStore()
    static = ModelRegistry([spec("builtin")])
    gateway = LiveRegistry(static, store)
    worker = LiveRegistry(static, store)
    await gateway.start()
    await worker.start()
    changes = []
    worker.add_listener(lambda: changes.append(1))

    await gateway.register_model(spec("fresh", aliases=["org/fresh"]))
    await gateway.register_adapter(AdapterSpec(name="v1", base="org/fresh", source="/a"))
    assert worker.resolve("org/fresh").id == "fresh"
    assert worker.resolve_adapter("fresh", "v1").source == "/a"
    assert changes

    restarted = LiveRegistry(static, store)
    await restarted.start()
    assert restarted.resolve("fresh").id == "fresh"
    assert [a.name for a in restarted.adapters("fresh")] == ["v1"]

    await gateway.remove_model("fresh")
    for registry in (worker, restarted):
        with pytest.raises(UnknownModelError):
            registry.resolve("fresh")
        with pytest.raises(UnknownAdapterError):
            registry.resolve_adapter("fresh", "v1")


async def test_conflicts_are_refused() -> None:
    registry = LiveRegistry(ModelRegistry([spec("builtin", aliases=["alias"])]), MemoryStore())
    await registry.start()
    with pytest.raises(RegistryConflictError):
        await registry.register_model(spec("alias"))
    with pytest.raises(RegistryConflictError, match="spec file"):
        await registry.remove_model("builtin")
    await registry.register_adapter(AdapterSpec(name="a", base="builtin", source="/a"))
    with pytest.raises(RegistryConflictError):
        await registry.register_adapter(AdapterSpec(name="a", base="builtin", source="/b"))
    with pytest.raises(UnknownModelError):
        await registry.register_adapter(AdapterSpec(name="a", base="nope", source="/b"))
