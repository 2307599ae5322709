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


async def test_a_watch_waits_for_a_bucket_the_server_does_not_show_yet(nats_server) -> None:
    """A JetStream cluster can answer "stream not found" for a bucket that another process
    is creating at that moment (nats-server #4600; a gateway of `shoal serve --nats-nodes
    3` failed to start on it in CI). Here the bucket really is missing for a moment, then
    made: the watch waits for it instead of failing, and delivers what it then holds."""
    settings = settings_for(nats_server.url).nats
    bus = await Bus.connect(settings, "test-kv-watch")
    maker = await Bus.connect(settings, "test-kv-maker")
    try:
        kv = await bus.key_value("test_watch_late")
        await bus.js.delete_key_value("test_watch_late")
        seen: dict[str, bytes | None] = {}
        delivered = asyncio.Event()

        def on_change(key: str, value: bytes | None) -> None:
            seen[key] = value
            delivered.set()

        watching = asyncio.create_task(kv.watch(on_change))
        await asyncio.sleep(1.0)
        assert not watching.done()  # still waiting, not failed
        made = await maker.key_value("test_watch_late")
        await made.put("model", b"spec")
        await asyncio.wait_for(watching, timeout=30)
        await asyncio.wait_for(delivered.wait(), timeout=10)
        assert seen == {"model": b"spec"}
        await kv.close()
    finally:
        await maker.close()
        await bus.close()
