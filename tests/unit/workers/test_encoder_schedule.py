"""The encoder worker's scheduling policy on a fake clock: idle, one pass, two side by
side, the pull horizon, and the batch lane under live load."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from shoal.model_registry import BatchProfile, ModelSpec
from shoal.workers.adapters.dummy import DummyAdapter
from shoal.workers.encoder.model import BatcherKey, EncoderModel
from shoal.workers.encoder.passes import Pass
from shoal.workers.encoder.schedule import (
    BATCH_LANE_LIVE_FETCH,
    IDLE_SLICES,
    LIVE_TRAFFIC_HORIZON,
    POOL_BATCHES,
    PULL_HORIZON,
    EncoderSchedule,
    Run,
)

PROFILE = BatchProfile(max_batch_tokens=1000, max_batch_items=8, max_wait_ms=0.0)
SPEC = ModelSpec(
    id="dummy/enc",
    tasks=["embed"],
    source="none",
    runtime="dummy",
    dims=4,
    max_length=64,
    profile=PROFILE,
)
HELD_SLOTS = 64
SLICE_MS = 10.0
LIVE = BatcherKey("embed", "", False)
BATCH_LANE = BatcherKey("embed", "", True)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class U:
    """A batcher unit: only its cost (tokens) matters to the policy."""

    cost: int


class TwoStreamAdapter(DummyAdapter):
    """Stands in for an engine that runs a pass in a stream of its own (the OpenVINO
    engine on a CPU): the dummy model has none, and the policy reads only this answer."""

    def runs_side_by_side(self, op: str, lora: str) -> bool:
        return not lora


def make(
    *, threads: int = 2, pairs: bool = True, two_streams: bool = False
) -> tuple[EncoderSchedule, EncoderModel, Clock]:
    clock = Clock()
    adapter = (TwoStreamAdapter if two_streams else DummyAdapter)(SPEC)
    model = EncoderModel(SPEC, adapter, clock)
    model.state = "resident"
    schedule = EncoderSchedule(
        {SPEC.id: model},
        clock,
        full_threads=threads,
        pairs=pairs,
        max_held_jobs=HELD_SLOTS,
        batch_slice_ms=SLICE_MS,
    )
    return schedule, model, clock


def queue(model: EncoderModel, key: BatcherKey, *costs: int) -> None:
    model.batcher(key.op, key.lora, key.batch_lane).add([U(c) for c in costs])


def start(schedule: EncoderSchedule, model: EncoderModel, token: object) -> Run:
    """Take the batch the policy names and report its pass started."""
    run = schedule.next()
    assert isinstance(run, Run), run
    batch = model.batchers[run.key].take(run.share)
    schedule.started(token, run, len(batch) * max(u.cost for u in batch))
    return run


def test_idle_a_due_live_batch_runs_alone_on_every_thread() -> None:
    schedule, model, _ = make()
    assert schedule.next() is None  # nothing queued: wait for an event
    assert schedule.room(SPEC.id, False, held=0, held_batch_lane=0) == HELD_SLOTS
    queue(model, LIVE, 10, 12)
    run = schedule.next()
    assert run == Run(model, LIVE, Pass.ALONE, 1.0, 2)
    # A live batch due: its pass starts before a pull could bring more.
    assert schedule.about_to_be_busy()
    assert schedule.room(SPEC.id, False, held=2, held_batch_lane=0) == 0


def test_a_batch_not_yet_due_names_when_it_will_be() -> None:
    schedule, model, clock = make()
    model.batcher("embed", "", False).profile = BatchProfile(
        max_batch_tokens=1000, max_batch_items=8, max_wait_ms=5.0
    )
    batcher = model.batchers[LIVE]
    for _ in range(4):  # arrivals 1 ms apart: the batcher holds a partial batch open
        batcher.add([U(3)])
        batcher.take()
        clock.now += 0.001
    batcher.add([U(3)])
    assert schedule.next() == pytest.approx(clock.now + 0.005)


def test_one_unmeasured_pass_holds_pulls_until_it_ends() -> None:
    schedule, model, _ = make()
    queue(model, LIVE, 10)
    start(schedule, model, "p1")
    queue(model, LIVE, 10)
    assert schedule.next() is None  # the next batch waits for the running pass
    # Its length is not yet known: no pull until an event (its end).
    assert schedule.room(SPEC.id, False, held=1, held_batch_lane=0) == 0
    assert schedule.pull_delay() is None
    assert schedule.computed("p1", Pass.ALONE) is False  # nothing else computing
    assert schedule.computed("p1", Pass.ALONE) is False  # a second report is ignored
    schedule.ended(Pass.ALONE)
    assert isinstance(schedule.next(), Run)


def test_pulls_resume_a_horizon_before_the_measured_pass_ends() -> None:
    schedule, model, clock = make()
    model.note_forward(0.1, 100)  # 1 ms a token
    queue(model, LIVE, 25, 25, 25, 25)  # one batch of 100 padded tokens: 100 ms
    start(schedule, model, "p1")
    assert schedule.pull_delay() == pytest.approx(0.1 - PULL_HORIZON)
    assert schedule.room(SPEC.id, False, held=4, held_batch_lane=0) == 0
    clock.now += 0.1 - PULL_HORIZON / 2  # within the horizon of its end
    assert not schedule.about_to_be_busy()
    assert schedule.room(SPEC.id, False, held=4, held_batch_lane=0) == HELD_SLOTS - 4
    assert schedule.pull_delay() == 0.0


def test_live_room_stops_at_the_pool_of_queued_batches_and_the_held_slots() -> None:
    schedule, model, _ = make()
    model.state = "loading"  # queued jobs wait, none due: only the caps apply
    queue(model, LIVE, *[3] * (POOL_BATCHES * PROFILE.max_batch_items - 1))
    assert schedule.room(SPEC.id, False, held=10, held_batch_lane=0) == HELD_SLOTS - 10
    assert schedule.room(SPEC.id, False, held=HELD_SLOTS + 3, held_batch_lane=0) == 0
    queue(model, LIVE, 3)
    assert schedule.room(SPEC.id, False, held=10, held_batch_lane=0) == 0
    assert schedule.room("not/served", False, held=0, held_batch_lane=0) == 0


def _pairing(schedule: EncoderSchedule, model: EncoderModel, clock: Clock) -> None:
    """Keep the worker busy long enough for the planner to pair passes (on batch-lane
    passes, which always run alone)."""
    for i in range(5):
        queue(model, BATCH_LANE, 10)
        run = start(schedule, model, f"warm{i}")
        clock.now += 1.0
        schedule.computed(f"warm{i}", run.mode)
        schedule.ended(run.mode)
    assert schedule.passes.pairing


def test_two_passes_side_by_side_each_take_half_the_budget_and_leave_room_beside() -> None:
    schedule, model, clock = make(two_streams=True)
    _pairing(schedule, model, clock)
    queue(model, LIVE, 10)
    first = start(schedule, model, "a")
    assert (first.mode, first.share, first.threads) == (Pass.BESIDE, 0.5, 2)
    # One pass beside nothing: pulls go on for a second at once.
    assert not schedule.about_to_be_busy()
    assert schedule.room(SPEC.id, False, held=1, held_batch_lane=0) == HELD_SLOTS - 1
    queue(model, LIVE, 10)
    second = start(schedule, model, "b")
    assert second.mode is Pass.BESIDE
    queue(model, LIVE, 10)
    assert schedule.next() is None  # two streams in use
    assert schedule.about_to_be_busy()
    assert schedule.computed("a", Pass.BESIDE) is True  # "b" still computes


def test_no_pairing_without_an_engine_stream_or_a_second_thread() -> None:
    for kwargs in ({"two_streams": False}, {"two_streams": True, "threads": 1}):
        schedule, model, clock = make(**kwargs)  # type: ignore[arg-type]
        _pairing(schedule, model, clock)
        queue(model, LIVE, 10)
        assert start(schedule, model, "x").mode is Pass.ALONE


def test_live_work_runs_before_batch_lane_work() -> None:
    schedule, model, _ = make()
    queue(model, BATCH_LANE, 10)
    queue(model, LIVE, 10)
    run = schedule.next()
    assert isinstance(run, Run) and run.key == LIVE
    # Nor is batch-lane work pulled while live work is pending on the worker.
    assert schedule.room(SPEC.id, True, held=2, held_batch_lane=1) == 0


def test_batch_lane_under_live_load_takes_one_slice_on_half_the_threads() -> None:
    schedule, model, clock = make()
    model.note_forward(0.1, 1000)  # 0.1 ms a token: a 10 ms slice is 100 tokens
    schedule.live_arrived()
    assert schedule.room(SPEC.id, True, held=0, held_batch_lane=0) == BATCH_LANE_LIVE_FETCH
    queue(model, BATCH_LANE, 10, 10)
    run = schedule.next()
    assert run == Run(model, BATCH_LANE, Pass.ALONE, 100 / 1000, 1)
    schedule.started("bl", run, 20)
    # A pass running with live traffic about: batch-lane pulls wait for its end.
    assert schedule.room(SPEC.id, True, held=2, held_batch_lane=2) == 0
    schedule.computed("bl", Pass.ALONE)
    schedule.ended(Pass.ALONE)

    clock.now += LIVE_TRAFFIC_HORIZON  # live traffic gone: ten slices on every thread
    run = schedule.next()
    assert run == Run(model, BATCH_LANE, Pass.ALONE, IDLE_SLICES * 100 / 1000, 2)
    room = schedule.room(SPEC.id, True, held=0, held_batch_lane=0)
    assert room == min(HELD_SLOTS // 2, 16)
    assert schedule.room(SPEC.id, True, held=40, held_batch_lane=30) == HELD_SLOTS // 2 - 30


def test_batch_lane_work_runs_one_input_until_the_model_is_measured() -> None:
    schedule, model, _ = make()
    queue(model, BATCH_LANE, 10, 10, 10)
    run = schedule.next()
    assert isinstance(run, Run) and run.share == 0.0
    assert len(model.batchers[BATCH_LANE].take(run.share)) == 1


def test_batch_lane_room_stops_at_two_batches_queued() -> None:
    schedule, model, _ = make()
    model.state = "loading"
    queue(model, BATCH_LANE, *[3] * (2 * PROFILE.max_batch_items))
    assert schedule.room(SPEC.id, True, held=0, held_batch_lane=0) == 0


def test_models_not_resident_have_nothing_due() -> None:
    schedule, model, _ = make()
    queue(model, LIVE, 10)
    model.state = "loading"
    assert schedule.next() is None
    assert not schedule.about_to_be_busy()
