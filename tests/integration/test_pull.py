"""`JetStreamPuller.fetch` against a real nats-server: one long-polled message, then a
`no_wait` request for more only where the message says more were waiting. The pull
requests are watched on their API subject from a second connection (a plain subscriber
gets a copy of each)."""

from __future__ import annotations

import asyncio
import json

import pytest

from shoal.config import NatsSettings
from shoal.queue import Bus, Subjects
from shoal.queue.provision import ensure_consumer, ensure_work_stream

MODEL = "test/pull"


@pytest.fixture
async def queue(nats_server):
    settings = NatsSettings(url=nats_server.url)
    subjects = Subjects(settings.subject_prefix)
    bus = await Bus.connect(settings, "test-pull")
    watcher = await Bus.connect(settings, "test-pull-watcher")
    await ensure_work_stream(bus, settings, subjects)
    consumer = await ensure_consumer(bus, settings, subjects, "interactive", MODEL)
    puller = await bus.puller(settings.stream, consumer)
    requests: list[dict] = []

    def seen(payload: bytes) -> None:
        requests.append(json.loads(payload))

    await watcher.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{settings.stream}.{consumer}", seen)
    subject = subjects.work("interactive", MODEL, "embed")

    async def publish(count: int) -> None:
        items = [(subject, f"item {i}".encode(), f"id-{i}") for i in range(count)]
        await bus.publish_work(items)

    try:
        yield puller, publish, requests
    finally:
        await puller.close()
        await watcher.close()
        await bus.close()


async def _requests_settled(requests: list[dict]) -> list[dict]:
    await asyncio.sleep(0.3)  # the watcher's copies arrive on their own connection
    return requests


async def test_a_lone_message_is_taken_with_one_pull_request(queue) -> None:
    puller, publish, requests = queue
    await publish(1)
    got = await puller.fetch(8, max_wait=2.0)
    assert [d.data for d in got] == [b"item 0"]
    # No second request for more: the message said none was waiting (a round trip on
    # a lone request's path otherwise).
    assert [r.get("no_wait") for r in await _requests_settled(requests)] == [None]
    for delivery in got:
        await delivery.ack()


async def test_messages_waiting_behind_the_first_are_taken_in_the_same_fetch(queue) -> None:
    puller, publish, requests = queue
    await publish(5)
    got = await puller.fetch(8, max_wait=2.0)
    assert [d.data for d in got] == [f"item {i}".encode() for i in range(5)]
    assert [r.get("no_wait") for r in await _requests_settled(requests)] == [None, True]
    for delivery in got:
        await delivery.ack()
