"""How many slots a generation worker's batch work leaves free for live requests."""

from __future__ import annotations

from shoal.workers.generation.held import LiveDemand


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_batch_job_alone_leaves_one_slot() -> None:
    demand = LiveDemand(cap=8, clock=Clock())
    demand.note(0)
    assert demand.spare() == 1


def test_the_spare_follows_the_recent_live_peak_up_to_the_cap() -> None:
    clock = Clock()
    demand = LiveDemand(cap=8, window=10.0, clock=clock)
    demand.note(1)  # one live stream at a time
    assert demand.spare() == 2
    demand.note(5)
    clock.now += 3
    demand.note(2)  # fewer now, but the peak of 3 s ago still counts
    assert demand.spare() == 6
    demand.note(30)
    assert demand.spare() == 8


def test_the_spare_is_given_back_after_the_window_without_live_work() -> None:
    clock = Clock()
    demand = LiveDemand(cap=8, window=10.0, clock=clock)
    demand.note(6)
    clock.now += 9
    demand.note(0)
    assert demand.spare() == 7
    clock.now += 2  # 11 s after the peak
    demand.note(0)
    assert demand.spare() == 1


def test_the_cap_is_one_at_least() -> None:
    demand = LiveDemand(cap=0, clock=Clock())
    demand.note(3)
    assert demand.spare() == 1
