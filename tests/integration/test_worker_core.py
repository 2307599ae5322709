"""The worker core against a real nats-server, with a scripted kind of worker.

`ScriptedKind` stands in for an encoder or generation runtime (what the core plugs into,
not a mock of NATS): each job's first text says what becomes of it, so every row of the
settle table, the room it reports, cancels, deadlines, keepalives, the registry and the
drain on stop are checked through real JetStream deliveries and real replies."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest

from shoal.config import Settings
from shoal.model_registry import LiveRegistry, ModelRegistry, ModelSpec
from shoal.queue import Bus, EmbedJob, EmbedResult, FailureCode, JobFailed, Subjects
from shoal.queue.dead_letters import DeadLetters
from shoal.queue.heartbeat import decode_heartbeat
from shoal.queue.messages import decode_reply, encode
from shoal.queue.provision import ensure_work_stream
from shoal.workers.core import SETTLE, Held, Outcome, Worker, WorkerKind

MODEL = "scripted"
SPEC = ModelSpec(id=MODEL, tasks=["embed"], source="none", runtime="dummy", dims=2, max_length=8)


class ScriptedKind(WorkerKind):
    """Answers `ok` jobs, holds `hold` jobs until released, settles `outcome:<name>` jobs
    with that outcome, and reports whatever room a test sets."""

    name = "scripted"

    def __init__(self, room: int = 8) -> None:
        self.room_left = room
        self.models: dict[str, ModelSpec] = {}
        self.holding: list[Held] = []
        self.dropped: list[Held] = []
        self.accepted = 0

    def serves(self, spec: ModelSpec) -> bool:
        return "embed" in spec.tasks

    async def add_model(self, spec: ModelSpec) -> None:
        self.models[spec.id] = spec

    async def remove_model(self, model: str) -> None:
        del self.models[model]

    def room(self, model: str, batch_lane: bool) -> int:
        return self.room_left - len(self.core.held)

    async def accept(self, model: str, jobs: list[Held], batch_lane: bool) -> None:
        for held in jobs:
            self.accepted += 1
            word = held.job.texts[0]  # type: ignore[attr-defined]
            if word == "ok":
                result = EmbedResult(
                    request_id=held.request_id, part=held.job.part, data=b"\0" * 8, rows=1, dims=2
                )
                await self.core.answer(held, result)
            elif word == "hold":
                self.holding.append(held)
            else:
                outcome = Outcome[word.split(":")[1].upper()]
                await self.core.settle(held, outcome, f"scripted {outcome.value}")

    def drop(self, jobs: list[Held]) -> None:
        self.dropped += jobs

    async def finish_held(self) -> None:
        for held in self.holding:
            if not held.done:
                result = EmbedResult(
                    request_id=held.request_id, part=held.job.part, data=b"\0" * 8, rows=1, dims=2
                )
                await self.core.answer(held, result)

    def heartbeat(self) -> dict[str, Any]:
        return {"active": len(self.holding)}


class Rig:
    """A worker core with a scripted kind on a real nats-server; jobs published straight
    to the work stream, replies and heartbeats collected from their subjects."""

    def __init__(self, url: str, **nats: Any) -> None:
        self.settings = Settings()
        self.settings.nats.url = url
        self.settings.nats.ack_wait = nats.pop("ack_wait", 5.0)
        self.settings.nats.max_deliver = nats.pop("max_deliver", 3)
        self.settings.worker.heartbeat_interval = 0.2
        self.subjects = Subjects(self.settings.nats.subject_prefix)
        self.replies: list[Any] = []
        self.beats: list[Any] = []
        self.workers: list[tuple[Worker, asyncio.Event, asyncio.Task]] = []
        self._published = itertools.count()

    async def open(self) -> None:
        self.bus = await Bus.connect(self.settings.nats, "test-rig")
        await self.bus.subscribe("test.replies", lambda d: self.replies.append(decode_reply(d)))
        await self.bus.subscribe(
            self.subjects.heartbeat, lambda d: self.beats.append(decode_heartbeat(d))
        )

    async def start(self, kind: ScriptedKind, registry: LiveRegistry | None = None) -> Worker:
        bus = await Bus.connect(self.settings.nats, "test-worker")
        if registry is None:
            registry = LiveRegistry(ModelRegistry([SPEC]))
        worker = Worker(self.settings, bus, registry, kind)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        await until(lambda: worker.state == "ready" or task.done(), "the worker ready")
        assert not task.done(), task.exception()
        self.workers.append((worker, stop, task))
        return worker

    async def stop(self, worker: Worker) -> None:
        for w, stop, task in self.workers:
            if w is worker and not task.done():
                stop.set()
                await task
                await w.bus.close()

    async def publish(self, word: str, request_id: str = "r1", deadline: float = 30.0) -> None:
        job = EmbedJob(
            request_id=request_id,
            part=0,
            model=MODEL,
            reply_to="test.replies",
            deadline=time.time() + deadline,
            texts=[word],
        )
        subject = self.subjects.work("interactive", MODEL, "embed")
        msg_id = f"{request_id}.{next(self._published)}"  # each its own: no dedup
        await self.bus.publish_work([(subject, encode(job), msg_id)])

    async def consumer(self) -> Any:
        name = f"interactive-{MODEL}"
        # The full consumer info (redeliveries, ack floor): nats-py's, for the test's eyes.
        return await self.bus.jsm.consumer_info(self.settings.nats.stream, name)

    async def close(self) -> None:
        for worker, _, _ in list(self.workers):
            await self.stop(worker)
        await self.bus.close()


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} not seen within {timeout}s"
        await asyncio.sleep(0.02)


@pytest.fixture
async def rig(nats_server) -> AsyncIterator[Rig]:
    r = Rig(nats_server.url)
    await r.open()
    yield r
    await r.close()


async def test_an_answered_job_is_replied_to_and_acked(rig: Rig) -> None:
    await rig.start(ScriptedKind())
    await rig.publish("ok")
    await until(lambda: rig.replies, "the reply")
    assert isinstance(rig.replies[0], EmbedResult)
    await until_acked(rig, 1)


@pytest.mark.parametrize(
    "outcome", [Outcome.INVALID, Outcome.NOT_FOUND, Outcome.UNAVAILABLE, Outcome.INTERNAL]
)
async def test_a_refused_job_gets_its_failure_and_is_terminated(rig: Rig, outcome) -> None:
    await rig.start(ScriptedKind())
    await rig.publish(f"outcome:{outcome.value}")
    await until(lambda: rig.replies, "the failure")
    failure = rig.replies[0]
    assert isinstance(failure, JobFailed)
    assert failure.code is SETTLE[outcome].failure
    assert failure.message == f"scripted {outcome.value}"
    assert failure.param == {
        FailureCode.INVALID_INPUT: "input",
        FailureCode.NOT_FOUND: "model",
    }.get(failure.code, "")
    await until_acked(rig, 1)  # a term moves the ack floor too: it is never redelivered
    await asyncio.sleep(0.3)
    assert (await rig.consumer()).num_redelivered == 0


async def test_a_failed_job_is_retried_then_kept_as_a_dead_letter(rig: Rig) -> None:
    kind = ScriptedKind()
    await rig.start(kind)
    await rig.publish("outcome:failed", request_id="doomed")
    await until(lambda: rig.replies, "the failure after the last delivery", timeout=20)
    assert kind.accepted == rig.settings.nats.max_deliver  # nak'ed, delivered again, ...
    assert isinstance(rig.replies[0], JobFailed) and rig.replies[0].code is FailureCode.INTERNAL
    letters = await DeadLetters(rig.bus, rig.settings.nats, rig.subjects).recent(10, MODEL)
    assert [letter.request_id for _, letter in letters] == ["doomed"]
    assert letters[0][1].reason == "max_deliver"


async def test_a_cancelled_or_returned_or_unsent_job_gets_no_reply(rig: Rig) -> None:
    kind = ScriptedKind()
    await rig.start(kind)
    await rig.publish("outcome:cancelled", request_id="c")
    await until_acked(rig, 1)
    await rig.publish("outcome:returned", request_id="r")
    await until(lambda: kind.accepted >= 3, "the returned job delivered again")
    await rig.publish("outcome:unsent", request_id="u")  # redelivered after ack_wait only
    await asyncio.sleep(0.5)
    assert rig.replies == []
    assert (await rig.consumer()).num_ack_pending >= 1


async def test_an_expired_job_is_answered_and_acked_unrun(rig: Rig) -> None:
    kind = ScriptedKind()
    await rig.start(kind)
    await rig.publish("ok", deadline=-1.0)
    await until(lambda: rig.replies, "the failure")
    assert rig.replies[0].code is FailureCode.DEADLINE_EXCEEDED
    assert kind.accepted == 0
    await until_acked(rig, 1)


async def test_nothing_is_pulled_without_room_and_everything_once_there_is(rig: Rig) -> None:
    kind = ScriptedKind(room=0)
    worker = await rig.start(kind)
    for i in range(3):
        await rig.publish("ok", request_id=f"q{i}")
    await asyncio.sleep(1.0)
    assert kind.accepted == 0 and (await rig.consumer()).num_pending == 3
    kind.room_left = 8
    worker.signal_room()
    await until(lambda: len(rig.replies) == 3, "three answers")


async def test_a_cancel_drops_held_jobs_and_acks_them(rig: Rig) -> None:
    kind = ScriptedKind()
    worker = await rig.start(kind)
    await rig.publish("hold", request_id="leaving")
    await until(lambda: kind.holding, "the job held")
    await rig.bus.publish(rig.subjects.cancel, b"leaving")
    await until(lambda: kind.dropped, "the drop")
    assert kind.dropped[0].request_id == "leaving" and not worker.held
    await until_acked(rig, 1)
    await rig.publish("ok", request_id="leaving")  # still queued when it was cancelled
    await until_acked(rig, 2)
    assert kind.accepted == 1 and rig.replies == []


async def test_a_job_held_past_ack_wait_is_kept_alive(nats_server) -> None:
    rig = Rig(nats_server.url, ack_wait=1.0)
    await rig.open()
    try:
        kind = ScriptedKind()
        await rig.start(kind)
        await rig.publish("hold")
        await asyncio.sleep(3.5)  # three ack_waits
        assert kind.accepted == 1 and (await rig.consumer()).num_redelivered == 0
        await kind.finish_held()
        await until_acked(rig, 1)
    finally:
        await rig.close()


class SlowStartKind(ScriptedKind):
    """Starts as slowly as an encoder kind loading its pinned models: the core pulls for
    its models meanwhile (their jobs wait for the load)."""

    async def start(self) -> None:
        await asyncio.sleep(3.5)  # three ack_waits of the rig below


async def test_a_job_pulled_while_the_kind_starts_is_kept_alive(nats_server) -> None:
    rig = Rig(nats_server.url, ack_wait=1.0)
    await rig.open()
    try:
        await ensure_work_stream(rig.bus, rig.settings.nats, rig.subjects)
        await rig.publish("hold")  # queued before the worker comes up
        kind = SlowStartKind()
        await rig.start(kind)
        # Held through the start, never redelivered: a start longer than max_deliver
        # ack_waits would otherwise make it a dead letter nobody failed on.
        assert kind.accepted == 1 and (await rig.consumer()).num_redelivered == 0
        await kind.finish_held()
        await until_acked(rig, 1)
    finally:
        await rig.close()


async def test_a_stop_drains_what_can_finish_and_returns_the_rest(rig: Rig) -> None:
    first = ScriptedKind()
    worker = await rig.start(first)
    await rig.publish("hold", request_id="stuck")
    await until(lambda: first.holding, "the job held")
    stopping = asyncio.create_task(rig.stop(worker))
    await asyncio.sleep(0.3)
    assert not stopping.done()  # draining: it waits for held work
    await stopping  # within the drain time; the held job is returned (nak) at its end
    second = ScriptedKind()
    await rig.start(second)
    await until(lambda: second.holding, "the returned job taken by another worker")
    assert second.holding[0].delivery.num_delivered == 2


async def test_heartbeats_carry_the_kinds_fields(rig: Rig) -> None:
    worker = await rig.start(ScriptedKind())
    await until(lambda: any(b.state == "ready" for b in rig.beats), "a ready heartbeat")
    beat = [b for b in rig.beats if b.state == "ready"][-1]
    assert beat.worker_id == worker.worker_id and worker.worker_id.startswith("scripted-")
    assert beat.models == [MODEL] and beat.active == 0


async def test_the_registry_adds_and_removes_served_models(rig: Rig) -> None:
    bucket = await rig.bus.key_value("TEST_REGISTRY")
    registry = LiveRegistry(ModelRegistry([]), bucket)
    await registry.start()
    kind = ScriptedKind()
    worker = await rig.start(kind, registry)
    assert worker.models == {}
    await registry.register_model(SPEC)
    await until(lambda: MODEL in worker.models, "the registered model served")
    await rig.publish("ok")
    await until(lambda: rig.replies, "an answer from the new model")
    await registry.remove_model(MODEL)
    await until(lambda: MODEL not in worker.models, "the model dropped")
    # The core stops pulling first, settles what it held, then tells the kind.
    await until(lambda: MODEL not in kind.models, "the kind told")


class FailsToAdd(ScriptedKind):
    """A kind whose model `broken` never loads, and whose every other model fails to load
    `flaky` times first (a source not yet reachable, a JetStream call timed out)."""

    def __init__(self, flaky: int) -> None:
        super().__init__()
        self.flaky = flaky
        self.tries: dict[str, int] = {}

    async def add_model(self, spec: ModelSpec) -> None:
        self.tries[spec.id] = self.tries.get(spec.id, 0) + 1
        if spec.id == "broken" or self.tries[spec.id] <= self.flaky:
            raise RuntimeError(f"{spec.id} would not load")
        await super().add_model(spec)


async def test_a_model_that_fails_to_add_neither_stops_the_others_nor_is_given_up(
    rig: Rig,
) -> None:
    bucket = await rig.bus.key_value("TEST_REGISTRY")
    registry = LiveRegistry(ModelRegistry([]), bucket)
    await registry.start()
    kind = FailsToAdd(flaky=2)
    worker = await rig.start(kind, registry)
    await registry.register_model(msgspec.structs.replace(SPEC, id="broken"))
    await until(lambda: kind.tries.get("broken"), "the broken model tried")
    # Registered after the failure, with no registry change after it: its own two
    # failures are tried again (1 s, then 2 s later), and it is served.
    await registry.register_model(SPEC)
    await until(lambda: MODEL in worker.models, "the registered model served", timeout=20.0)
    assert kind.tries[MODEL] == 3 and "broken" not in worker.models
    await rig.publish("ok")
    await until(lambda: rig.replies, "an answer from the model registered after the failure")
    assert kind.tries["broken"] >= 2  # still tried, never served


async def until_acked(rig: Rig, count: int) -> None:
    deadline = time.monotonic() + 10
    while (await rig.consumer()).ack_floor.consumer_seq < count:
        assert time.monotonic() < deadline, "not acked in time"
        await asyncio.sleep(0.05)


def test_every_outcome_has_one_settlement() -> None:
    assert set(SETTLE) == set(Outcome)
