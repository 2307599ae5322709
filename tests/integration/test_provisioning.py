"""Provisioning against a real nats-server: what a JetStream cluster can answer "not
found" for a moment (a stream or bucket another process is creating: nats-server #4600;
a gateway of `shoal serve --nats-nodes 3` died of it in CI) is waited for, within the
provisioning bound, instead of failing the process's start. A real missing stream, made
a moment later, stands in for the cluster's transient answer, which cannot be caused on
demand."""

from __future__ import annotations

import asyncio

from shoal.queue.nats import Bus
from shoal.queue.provision import ensure_consumer, ensure_work_stream
from shoal.queue.subjects import Subjects
from tests.integration.test_queue_semantics import settings_for


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
        assert not watching.done(), watching.exception()  # still waiting, not failed
        made = await maker.key_value("test_watch_late")
        await made.put("model", b"spec")
        await asyncio.wait_for(watching, timeout=30)
        await asyncio.wait_for(delivered.wait(), timeout=10)
        assert seen == {"model": b"spec"}
        await kv.close()
    finally:
        await maker.close()
        await bus.close()


async def test_a_consumer_waits_for_a_work_stream_the_server_does_not_show_yet(
    nats_server,
) -> None:
    nats = settings_for(nats_server.url).nats
    subjects = Subjects(nats.subject_prefix)
    bus = await Bus.connect(nats, "test-consumer")
    maker = await Bus.connect(nats, "test-stream-maker")
    try:
        ensuring = asyncio.create_task(
            ensure_consumer(bus, nats, subjects, "interactive", "some-model")
        )
        await asyncio.sleep(1.0)
        assert not ensuring.done(), ensuring.exception()  # still waiting, not failed
        await ensure_work_stream(maker, nats, subjects)
        name = await asyncio.wait_for(ensuring, timeout=30)
        assert (await bus.jsm.consumer_info(nats.stream, name)).name == name
    finally:
        await maker.close()
        await bus.close()
