"""Real JetStream semantics under the worker loop: an in-process EncoderWorker with the
dummy adapter against a real nats-server, driven through the gateway's Dispatcher."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest

from shoal.config import Settings
from shoal.model_registry import BatchProfile, LiveRegistry, ModelRegistry, ModelSpec
from shoal.queue import (
    Bus,
    Dispatcher,
    EmbedJob,
    FailureCode,
    JobFailedError,
    QueueFullError,
    Subjects,
)
from shoal.queue.dead_letters import DeadLetters
from shoal.queue.errors import BacklogTooLongError, DeadlineExceededError, PayloadStoreError
from shoal.queue.messages import decode_job, decode_reply, encode
from shoal.queue.objects import LocalObjectStore
from shoal.queue.payloads import PayloadStore
from shoal.queue.provision import ensure_consumer, ensure_work_stream
from shoal.workers.adapters.dummy import DummyAdapter
from shoal.workers.encoder.passes import PassPlanner
from shoal.workers.encoder.worker import EncoderWorker

SPEC = ModelSpec(
    id="dummy/enc",
    tasks=["embed"],
    source="none",
    runtime="dummy",
    dims=16,
    max_length=8,
    profile=BatchProfile(max_batch_tokens=512, max_batch_items=16, max_wait_ms=2.0),
)


class FlakyAdapter(DummyAdapter):
    """Fails every forward pass that contains the word 'boom'."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.failures = 0

    def embed(self, batch):
        if any(int(t.ids[1]) == self._boom for t in batch if len(t.ids) > 2):
            self.failures += 1
            raise RuntimeError("boom")
        return super().embed(batch)

    def load(self, path: str) -> None:
        self._boom = int(self.tokenize(["boom"])[0].ids[1])


def settings_for(url: str, **nats) -> Settings:
    s = Settings()
    s.nats.url = url
    s.nats.ack_wait = nats.pop("ack_wait", 2.0)
    s.nats.max_deliver = nats.pop("max_deliver", 3)
    for k, v in nats.items():
        setattr(s.nats, k, v)
    s.gateway.no_worker_policy = "queue"
    s.worker.heartbeat_interval = 0.2
    s.worker.pinned = [SPEC.id]
    return s


class RecordingStore(LocalObjectStore):
    """A real local object store that remembers the keys written to it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.written: list[str] = []

    async def put_bytes(self, key: str, data: bytes) -> None:
        self.written.append(key)
        await super().put_bytes(key, data)

    def held(self) -> list[Path]:
        return [p for p in self.root.rglob("*") if p.is_file()]


class Harness:
    def __init__(self, settings: Settings, objects: LocalObjectStore) -> None:
        self.settings = settings
        self.subjects = Subjects(settings.nats.subject_prefix)
        self.workers: list[tuple[EncoderWorker, asyncio.Event, asyncio.Task]] = []
        self.objects = objects

    async def open(self) -> None:
        self.bus = await Bus.connect(self.settings.nats, "test-gateway")
        self.payloads = PayloadStore(
            self.objects, self.settings.nats.offload_bytes, self.bus.max_payload
        )
        self.dispatcher = Dispatcher(
            self.bus, self.subjects, self.settings.gateway, self.settings.nats, self.payloads
        )
        await self.dispatcher.start()
        self.dead = DeadLetters(self.bus, self.settings.nats, self.subjects)
        await self.dead.watch_exhausted()

    async def add_worker(self, adapter: DummyAdapter | None = None) -> EncoderWorker:
        bus = await Bus.connect(self.settings.nats, "test-worker")
        registry = LiveRegistry(ModelRegistry([adapter.spec if adapter else SPEC]))
        worker = EncoderWorker(
            self.settings, bus, registry, [adapter or DummyAdapter(SPEC)], payloads=self.payloads
        )
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        deadline = time.monotonic() + 10
        while worker.state != "ready":
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.02)
        self.workers.append((worker, stop, task))
        worker.bus_for_test = bus
        return worker

    async def stop_worker(self, worker: EncoderWorker) -> None:
        for w, stop, task in self.workers:
            if w is worker:
                stop.set()
                await task
                await w.bus.close()

    def job(self, request_id: str, texts: list[str], part: int = 0, **kw) -> EmbedJob:
        return EmbedJob(
            request_id=request_id,
            part=part,
            model=SPEC.id,
            reply_to=self.dispatcher.reply_subject,
            deadline=kw.pop("deadline", time.time() + 30),
            texts=texts,
            **kw,
        )

    async def embed(self, texts: list[str], timeout: float = 20, **kw) -> np.ndarray:
        rid = self.dispatcher.new_request_id()
        results = await self.dispatcher.submit(
            rid, [self.job(rid, texts, **kw)], "interactive", time.time() + timeout
        )
        r = results[0]
        return np.frombuffer(r.data, dtype="<f4").reshape(r.rows, r.dims)

    async def close(self) -> None:
        await self.dispatcher.close()
        for w, stop, task in self.workers:
            if not task.done():
                stop.set()
                await task
                await w.bus.close()
        await self.bus.close()


def expected(texts: list[str]) -> np.ndarray:
    ref = DummyAdapter(SPEC)
    return ref.embed(ref.tokenize(texts))


async def test_a_job_goes_round_trip(harness: Harness) -> None:
    await harness.add_worker()
    texts = ["one two", "three", "four five six"]
    np.testing.assert_allclose(await harness.embed(texts), expected(texts), rtol=1e-6)


class GatedLoadAdapter(DummyAdapter):
    """Its load waits for `release`: a pinned model that takes long to load."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.release = threading.Event()

    def load(self, path: str) -> None:
        assert self.release.wait(30)


async def test_a_pinned_model_serves_while_the_next_pinned_one_still_loads(harness) -> None:
    # Before, a worker scheduled no pass until every pinned model had loaded: after a
    # restart under load, embeddings waited for the reranker's load too.
    second = msgspec.structs.replace(SPEC, id="dummy/second")
    gated = GatedLoadAdapter(second)
    harness.settings.worker.pinned = [SPEC.id, second.id]
    bus = await Bus.connect(harness.settings.nats, "test-worker")
    registry = LiveRegistry(ModelRegistry([SPEC, second]))
    worker = EncoderWorker(
        harness.settings, bus, registry, [DummyAdapter(SPEC), gated], payloads=harness.payloads
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    harness.workers.append((worker, stop, task))  # stopped by the harness
    try:
        texts = ["one two", "three"]
        np.testing.assert_allclose(await harness.embed(texts, timeout=10), expected(texts))
        assert worker.state == "loading" and not task.done()  # the second is still loading
    finally:
        gated.release.set()
    deadline = time.monotonic() + 10
    while worker.state != "ready":
        assert time.monotonic() < deadline and not task.done()
        await asyncio.sleep(0.02)


async def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(harness) -> None:
    adapter = DummyAdapter(SPEC)
    await harness.add_worker(adapter)
    texts = [[f"request {i} word {j}" for j in range(i % 3 + 1)] for i in range(120)]
    results = await asyncio.gather(*(harness.embed(t) for t in texts))
    for t, got in zip(texts, results, strict=True):
        np.testing.assert_allclose(got, expected(t), rtol=1e-6)
    assert max(adapter.batches) > 1, adapter.batches


class SlowWordAdapter(DummyAdapter):
    """Takes `SLOW_S` over a batch holding the word 'slow'; notes which batches it ran."""

    SLOW_S = 1.5

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.slow_started = asyncio.Event()
        self.texts_seen: list[int] = []
        self._loop = asyncio.get_running_loop()

    def embed(self, batch):
        slow = int(self.tokenize(["slow"])[0].ids[1])
        self.texts_seen.append(len(batch))
        if any(slow in t.ids for t in batch):
            self._loop.call_soon_threadsafe(self.slow_started.set)
            time.sleep(self.SLOW_S)
        return super().embed(batch)


class PairingAdapter(DummyAdapter):
    """Runs passes side by side, as the OpenVINO engine does, each slowly enough that
    requests pile up behind it."""

    def runs_side_by_side(self, op: str, lora: str) -> bool:
        return True

    def embed(self, batch):
        time.sleep(0.05)
        return super().embed(batch)


async def test_a_pass_beside_another_takes_half_the_token_budget(harness: Harness) -> None:
    # Eight inputs of 8 tokens fill the 64-token budget of a pass alone; beside another,
    # on half the threads, a pass takes 32 tokens, so it ends when a full one alone would.
    spec = msgspec.structs.replace(
        SPEC, profile=BatchProfile(max_batch_tokens=64, max_batch_items=16, threads=2)
    )
    adapter = PairingAdapter(spec)
    worker = await harness.add_worker(adapter)
    worker.kind.schedule.passes = PassPlanner(time.monotonic, pairs=True, enter=0.0, leave=-1.0)
    texts = [f"w{i} a b c d e" for i in range(48)]  # 6 words: 8 tokens with CLS and SEP
    results = await asyncio.gather(*(harness.embed([t]) for t in texts))
    for text, got in zip(texts, results, strict=True):
        np.testing.assert_allclose(got, expected([text]), rtol=1e-6)
    assert worker.kind.schedule.passes.side_by_side > 0
    assert max(adapter.batches[1:]) == 4, adapter.batches  # after the warm-up's


async def test_a_busy_worker_leaves_new_work_to_an_idle_one(harness: Harness) -> None:
    """A worker running a long forward pass keeps no pull waiting (encoder_worker's pull
    horizon): requests that arrive meanwhile go to the idle worker instead of queueing
    behind the pass. Before, the busy worker's waiting pull took every other request."""
    adapters = [SlowWordAdapter(SPEC), SlowWordAdapter(SPEC)]
    for adapter in adapters:
        await harness.add_worker(adapter)
        adapter.texts_seen.clear()  # its warm-up
    slow = asyncio.create_task(harness.embed(["slow"]))
    await asyncio.wait(
        [asyncio.create_task(a.slow_started.wait()) for a in adapters],
        return_when=asyncio.FIRST_COMPLETED,
        timeout=10,
    )
    busy = next(a for a in adapters if a.slow_started.is_set())
    for i in range(6):  # one at a time: each goes to the oldest waiting pull
        started = time.monotonic()
        await harness.embed([f"quick {i}"])
        assert time.monotonic() - started < SlowWordAdapter.SLOW_S / 2, i
    assert busy.texts_seen == [1]  # only the slow text
    await slow


async def test_an_expired_job_is_dropped_answered_and_acked(harness: Harness) -> None:
    adapter = DummyAdapter(SPEC)
    await harness.add_worker(adapter)
    replies: list = []
    await harness.bus.subscribe("test.replies", lambda data: replies.append(decode_reply(data)))
    job = harness.job("late", ["never run"], deadline=time.time() - 1)
    job = EmbedJob(
        **{**{f: getattr(job, f) for f in job.__struct_fields__}, "reply_to": "test.replies"}
    )
    await harness.bus.publish_work(
        [(harness.subjects.work("interactive", SPEC.id, "embed"), encode(job), "late.0")]
    )
    await _until(lambda: replies)
    assert replies[0].code is FailureCode.DEADLINE_EXCEEDED
    assert adapter.batches == [1]  # only the warm-up ran
    await _until_stream_empty(harness)


async def test_too_long_input_without_truncation_fails_and_is_terminated(harness) -> None:
    await harness.add_worker()
    with pytest.raises(JobFailedError) as info:
        await harness.embed(["w " * 50], truncate=False)
    assert info.value.failure.code is FailureCode.INVALID_INPUT
    assert "52 tokens" in info.value.failure.message
    # With truncation (the default) the same input is served.
    assert (await harness.embed(["w " * 50])).shape == (1, 16)
    await _until_stream_empty(harness)


async def test_a_failing_forward_is_retried_then_fails_after_max_deliver(harness) -> None:
    adapter = FlakyAdapter(SPEC)
    await harness.add_worker(adapter)
    with pytest.raises(JobFailedError) as info:
        await harness.embed(["boom"], timeout=30)
    assert info.value.failure.code is FailureCode.INTERNAL
    assert adapter.failures == harness.settings.nats.max_deliver
    await _until_stream_empty(harness)


class Slow(DummyAdapter):
    def embed(self, batch):
        time.sleep(0.05)
        return super().embed(batch)


async def test_a_cancelled_request_stops_running_and_its_queued_items_are_dropped(
    harness,
) -> None:
    """The gateway gives up (client gone): held items are dropped at once and those still
    in the stream are acked unrun when pulled; the worker goes on serving others."""
    adapter = Slow(SPEC)
    await harness.add_worker(adapter)
    rid = harness.dispatcher.new_request_id()
    jobs = [harness.job(rid, [f"part {i}"], part=i) for i in range(600)]
    task = asyncio.create_task(
        harness.dispatcher.submit(rid, jobs, "interactive", time.time() + 60)
    )
    await _until(lambda: sum(adapter.batches) > 20)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _until_stream_empty(harness)
    ran = sum(adapter.batches) - 1  # less the warm-up
    assert ran < 300, ran  # without the cancel all 600 run (about 2 s of forwards)
    await asyncio.sleep(0.5)
    assert sum(adapter.batches) - 1 == ran  # nothing of it runs later
    texts = ["still serving"]
    np.testing.assert_allclose(await harness.embed(texts), expected(texts), rtol=1e-6)


async def test_live_work_that_would_outwait_its_deadline_is_refused_at_once(harness) -> None:
    """A backlog of ~5 s (measured from the model's consumer: depth over drain rate):
    a request with a 1 s deadline is refused at once with a retry hint, one with a
    long deadline is queued and answered, and batch-lane work is never refused."""

    class Slower(DummyAdapter):
        def embed(self, batch):
            time.sleep(0.2)  # 16 inputs per 0.2 s: about 80 a second
            return super().embed(batch)

    await harness.add_worker(Slower(SPEC))
    flood = [asyncio.create_task(harness.embed([f"flood {i}"], timeout=60)) for i in range(500)]
    await asyncio.sleep(3.0)  # the monitor measures the drain rate meanwhile
    started = time.monotonic()
    rid = harness.dispatcher.new_request_id()
    with pytest.raises(BacklogTooLongError) as caught:
        await harness.dispatcher.submit(
            rid, [harness.job(rid, ["in a hurry"])], "interactive", time.time() + 1
        )
    assert time.monotonic() - started < 0.5
    assert caught.value.wait > 1.0 and caught.value.retry_after >= 1.0
    rid = harness.dispatcher.new_request_id()
    batch_lane = harness.dispatcher.submit(
        rid, [harness.job(rid, ["no hurry"])], "batch", time.time() + 1
    )
    # Queued, not refused: it times out behind the backlog, or is answered in time where
    # the worker's pool stood empty between two live pulls (the batch lane is pulled only
    # then: encoder/schedule.py), as one run of the whole suite on two workers saw.
    with contextlib.suppress(DeadlineExceededError):
        await batch_lane
    texts = ["patient"]
    np.testing.assert_allclose(await harness.embed(texts, timeout=60), expected(texts), rtol=1e-6)
    await asyncio.gather(*flood)


async def test_a_poison_input_fails_alone_and_ends_as_a_dead_letter(harness) -> None:
    """One input that crashes the forward pass, batched with good ones: the batch is
    split until the poison runs alone, its mates are answered on the first delivery,
    and after max_deliver it is a dead letter and its request a clear failure."""
    adapter = FlakyAdapter(SPEC)
    await harness.add_worker(adapter)
    good = [[f"good {i} a", f"good {i} b"] for i in range(12)]
    calls = [harness.embed(texts) for texts in good[:6]]
    calls.append(harness.embed(["fine", "boom", "also fine"]))
    calls.extend(harness.embed(texts) for texts in good[6:])
    results = await asyncio.gather(*calls, return_exceptions=True)
    poisoned = results.pop(6)
    assert isinstance(poisoned, JobFailedError), poisoned
    assert poisoned.failure.code is FailureCode.INTERNAL
    assert "dead letter" in poisoned.failure.message
    for texts, got in zip(good, results, strict=True):
        np.testing.assert_allclose(got, expected(texts), rtol=1e-6)
    max_deliver = harness.settings.nats.max_deliver
    assert max(adapter.batches) > 3  # the poison shared batches with good inputs
    letters = await harness.dead.recent(10)
    assert len(letters) == 1
    _, letter = letters[0]
    assert (letter.model, letter.op, letter.reason) == (SPEC.id, "embed", "max_deliver")
    assert letter.deliveries == max_deliver
    assert "boom" in letter.error and letter.worker_id.startswith("enc-")
    assert decode_job(letter.item).texts == ["fine", "boom", "also fine"]
    await _until_stream_empty(harness)


async def test_an_item_whose_workers_keep_dying_ends_as_a_dead_letter(
    nats_server, tmp_path: Path
) -> None:
    """A worker that dies holding the item (it never settles it), every delivery: after
    max_deliver JetStream gives up, and the gateway buries it and answers the request
    instead of leaving it to its deadline or in the stream forever."""
    h = Harness(
        settings_for(nats_server.url, ack_wait=1.0, max_deliver=2), RecordingStore(tmp_path)
    )
    await h.open()
    try:
        s = h.settings
        consumer = await ensure_consumer(h.bus, s.nats, h.subjects, "interactive", SPEC.id)
        dying = await h.bus.puller(s.nats.stream, consumer)
        started = time.monotonic()
        task = asyncio.create_task(h.embed(["crashes every worker"], timeout=60))
        for _ in range(2):  # taken, never settled: as if its worker died each time
            assert len(await dying.fetch(1, 5.0)) == 1
        # JetStream notices the exhausted item when a worker next asks for work.
        assert await dying.fetch(1, 2.0) == []
        with pytest.raises(JobFailedError) as caught:
            await task
        assert time.monotonic() - started < 30  # well before the request's deadline
        assert "stopped without an answer" in caught.value.failure.message
        (_, letter), *_ = await h.dead.recent(10)
        assert (letter.reason, letter.worker_id, letter.deliveries) == ("worker_crashed", "", 2)
        assert decode_job(letter.item).texts == ["crashes every worker"]
        await _until_stream_empty(h)
        await dying.close()
    finally:
        await h.close()


async def test_an_item_held_by_a_crashed_consumer_is_redelivered_after_ack_wait(harness) -> None:
    s = harness.settings
    await ensure_work_stream(harness.bus, s.nats, harness.subjects)
    consumer = await ensure_consumer(harness.bus, s.nats, harness.subjects, "interactive", SPEC.id)
    crashed = await harness.bus.puller(s.nats.stream, consumer)
    task = asyncio.create_task(harness.embed(["survives a crash"]))
    taken = await crashed.fetch(1, 5.0)
    assert len(taken) == 1  # held by a "worker" that will never ack
    started = time.monotonic()
    await harness.add_worker()
    got = await task
    assert time.monotonic() - started >= s.nats.ack_wait * 0.8
    np.testing.assert_allclose(got, expected(["survives a crash"]), rtol=1e-6)


async def test_a_stopping_worker_returns_what_it_holds_at_once(harness) -> None:
    harness.settings.nats.ack_wait = 30.0  # a redelivery by timeout would take this long
    first = await harness.add_worker(Slow(SPEC))
    tasks = [asyncio.create_task(harness.embed([f"t{i}"], timeout=25)) for i in range(40)]
    await asyncio.sleep(0.3)
    await harness.add_worker()
    started = time.monotonic()
    await harness.stop_worker(first)
    results = await asyncio.gather(*tasks)
    assert len(results) == 40
    assert time.monotonic() - started < 15


async def test_the_same_msg_id_is_queued_once(harness: Harness) -> None:
    s = harness.settings
    await ensure_work_stream(harness.bus, s.nats, harness.subjects)
    subject = harness.subjects.work("interactive", SPEC.id, "embed")
    job = encode(harness.job("dup", ["x"]))
    await harness.bus.publish_work([(subject, job, "dup.0"), (subject, job, "dup.0")])
    state = await harness.bus.stream_state(s.nats.stream)
    assert state["messages"] == 1


async def test_a_full_stream_refuses_new_work_at_once(nats_server, tmp_path: Path) -> None:
    h = Harness(settings_for(nats_server.url, max_msgs=3), RecordingStore(tmp_path))
    await h.open()
    try:
        waiting = [asyncio.create_task(h.embed([f"q{i}"], timeout=5)) for i in range(3)]
        await asyncio.sleep(0.3)
        started = time.monotonic()
        with pytest.raises(QueueFullError):
            await h.embed(["one too many"])
        assert time.monotonic() - started < 1.0
        for task in waiting:
            task.cancel()
    finally:
        await h.close()


async def _until(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def _until_stream_empty(h: Harness, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (await h.bus.stream_state(h.settings.nats.stream))["messages"]:
        assert time.monotonic() < deadline, "the stream still holds items"
        await asyncio.sleep(0.05)


async def test_an_item_the_worker_cannot_read_is_answered_not_left_to_time_out(harness) -> None:
    import msgspec

    await harness.add_worker()
    replies: list = []
    await harness.bus.subscribe("test.replies", lambda data: replies.append(decode_reply(data)))
    future_job = msgspec.msgpack.encode(
        {
            "type": "a-newer-op",
            "request_id": "new",
            "part": 0,
            "model": SPEC.id,
            "reply_to": "test.replies",
            "deadline": time.time() + 30,
        }
    )
    subject = harness.subjects.work("interactive", SPEC.id, "embed")
    await harness.bus.publish_work([(subject, future_job, "new.0")])
    await _until(lambda: replies)
    assert replies[0].code is FailureCode.INTERNAL
    assert "could not read" in replies[0].message
    await _until_stream_empty(harness)


async def test_items_and_replies_too_large_for_a_message_travel_through_the_store(
    nats_server, tmp_path: Path
) -> None:
    store = RecordingStore(tmp_path / "objects")
    h = Harness(settings_for(nats_server.url, offload_bytes=4096), store)
    await h.open()
    try:
        await h.add_worker()
        texts = [f"word{i} " * 60 for i in range(100)]  # ~40 KiB of job, ~6 KiB of reply
        np.testing.assert_allclose(await h.embed(texts), expected(texts), rtol=1e-6)
        kinds = sorted(key.rsplit(".", 1)[1] for key in store.written)
        assert kinds == ["job", "result"]
        assert store.held() == []  # both deleted once the request was answered
        small = ["fits in one message"]
        np.testing.assert_allclose(await h.embed(small), expected(small), rtol=1e-6)
        assert len(store.written) == 2
        await _until_stream_empty(h)
    finally:
        await h.close()


async def test_an_unwritable_payload_store_fails_the_request_at_once(
    nats_server, tmp_path: Path
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("a file where the store's directory should be")
    h = Harness(settings_for(nats_server.url, offload_bytes=1024), RecordingStore(blocked))
    await h.open()
    try:
        await h.add_worker()
        started = time.monotonic()
        with pytest.raises(PayloadStoreError):
            await h.embed(["word " * 400])
        assert time.monotonic() - started < 2.0
        assert (await h.embed(["small"])).shape == (1, 16)  # what fits is unaffected
    finally:
        await h.close()
