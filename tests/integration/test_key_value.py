"""The key-value bucket against a real nats-server: listing keys is exact every time.

nats-py's own `KeyValue.keys()` once answered [] while a file existed (a CI failure of
the files list); `NatsKeyValue.keys()` must never miss a key nor list a deleted one."""

from __future__ import annotations

import asyncio

from shoal.queue.nats import Bus
from tests.integration.test_queue_semantics import settings_for


async def test_keys_lists_every_live_key_every_time(nats_server) -> None:
    bus = await Bus.connect(settings_for(nats_server.url).nats, "test-kv")
    try:
        kv = await bus.key_value("test_keys")
        assert await kv.keys() == []
        for i in range(1500):  # more than one fetch
            await kv.put(f"k{i:04d}", b"v")
        for i in range(0, 1500, 3):
            await kv.delete(f"k{i:04d}")
        await kv.put("k0003", b"again")
        live = {f"k{i:04d}" for i in range(1500) if i % 3} | {"k0003"}
        answers = await asyncio.gather(*(kv.keys() for _ in range(20)))
        for keys in answers:
            assert len(keys) == len(set(keys))
            assert set(keys) == live
        # Each listing removes its consumer: a burst of them must not reach the limit.
        assert (await bus.js.stream_info("KV_test_keys")).state.consumer_count == 0
    finally:
        await bus.close()


async def test_values_reads_every_live_value_in_one_pass(nats_server) -> None:
    """What the storage quota reads: each live key's latest value, none deleted."""
    bus = await Bus.connect(settings_for(nats_server.url).nats, "test-kv-values")
    try:
        kv = await bus.key_value("test_values")
        assert await kv.values() == {}
        for i in range(1200):  # more than one fetch
            await kv.put(f"k{i:04d}", f"v{i}".encode())
        for i in range(0, 1200, 4):
            await kv.delete(f"k{i:04d}")
        await kv.put("k0001", b"changed")
        expected = {f"k{i:04d}": f"v{i}".encode() for i in range(1200) if i % 4}
        expected["k0001"] = b"changed"
        assert await kv.values() == expected
        assert (await bus.js.stream_info("KV_test_values")).state.consumer_count == 0
    finally:
        await bus.close()
