"""The batcher on a fake clock: budgets, length sorting, the adaptive window, fairness."""

from dataclasses import dataclass

from shoal.model_registry import BatchProfile
from shoal.workers.batcher import Batcher


@dataclass
class U:
    cost: int
    name: str = ""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(max_tokens: int = 100, max_items: int = 4, wait_ms: float = 5.0):
    clock = Clock()
    profile = BatchProfile(
        max_batch_tokens=max_tokens, max_batch_items=max_items, max_wait_ms=wait_ms
    )
    return Batcher(profile, clock), clock


def test_nothing_pending_is_never_ready() -> None:
    batcher, _ = make()
    assert batcher.ready_at() is None
    assert not batcher.ready()
    assert batcher.take() == []


def test_a_lone_arrival_runs_at_once() -> None:
    batcher, _ = make()
    batcher.add([U(3)])
    assert batcher.ready()  # no history of close arrivals: waiting would only add latency


def test_frequent_arrivals_hold_a_partial_batch_open_for_the_window() -> None:
    batcher, clock = make(wait_ms=5.0)
    for _ in range(5):
        batcher.add([U(1)])
        batcher.take()
        clock.now += 0.001  # 1 ms apart: arrivals come faster than the window
    batcher.add([U(2)])
    assert not batcher.ready()
    assert batcher.ready_at() == clock.now + 0.005
    clock.now += 0.005
    assert batcher.ready()


def test_a_full_batch_is_ready_without_waiting() -> None:
    batcher, clock = make(max_items=3, wait_ms=50)
    for _ in range(3):
        batcher.add([U(1)])
        clock.now += 0.0001
    assert batcher.ready()
    batcher2, _ = make(max_tokens=10, wait_ms=50)
    batcher2.add([U(6)])
    batcher2.add([U(6)])
    assert batcher2.ready()


def test_take_respects_the_item_budget_and_serves_the_oldest_first() -> None:
    batcher, _ = make(max_tokens=1000, max_items=4)
    batcher.add([U(10, str(i)) for i in range(10)])
    assert [u.name for u in batcher.take()] == ["0", "1", "2", "3"]  # equal lengths: FIFO
    assert len(batcher) == 6
    assert batcher.pending_tokens == 60


def test_take_groups_by_length_around_the_oldest_unit() -> None:
    batcher, _ = make(max_tokens=1000, max_items=3)
    batcher.add([U(20, "oldest"), U(2, "a"), U(21, "b"), U(3, "c"), U(19, "d"), U(2, "e")])
    first = batcher.take()
    assert sorted(u.name for u in first) == ["b", "d", "oldest"]
    assert [u.cost for u in first] == sorted(u.cost for u in first)
    assert sorted(u.name for u in batcher.take()) == ["a", "c", "e"]


def test_take_keeps_padded_cost_within_the_token_budget() -> None:
    batcher, _ = make(max_tokens=64, max_items=8)
    batcher.add([U(30, "long"), U(2, "a"), U(3, "b"), U(2, "c"), U(20, "mid")])
    seen = []
    while len(batcher):
        batch = batcher.take()
        assert len(batch) * max(u.cost for u in batch) <= 64 or len(batch) == 1
        seen += [u.name for u in batch]
    assert sorted(seen) == ["a", "b", "c", "long", "mid"]
    assert batcher.pending_tokens == 0


def test_no_unit_starves_behind_a_stream_of_others() -> None:
    batcher, _ = make(max_tokens=10_000, max_items=2)
    batcher.add([U(50, "odd one")])
    for i in range(3):
        batcher.add([U(5, f"s{i}"), U(5, f"t{i}")])
    assert "odd one" in [u.name for u in batcher.take()]


def test_an_oversized_unit_runs_alone() -> None:
    batcher, _ = make(max_tokens=16)
    batcher.add([U(40, "huge"), U(2, "small")])
    assert [u.name for u in batcher.take()] == ["huge"]
    assert [u.name for u in batcher.take()] == ["small"]


def test_drop_removes_units_and_their_tokens() -> None:
    batcher, _ = make()
    batcher.add([U(5, "keep"), U(7, "drop")])
    dropped = batcher.drop(lambda u: u.name == "keep")
    assert [u.name for u in dropped] == ["drop"]
    assert batcher.pending_tokens == 5
    assert len(batcher) == 1


def test_a_token_share_cuts_the_batch_but_never_to_nothing() -> None:
    batcher, _ = make(max_tokens=1000, max_items=8)
    batcher.add([U(16, str(i)) for i in range(10)])
    assert len(batcher.take(token_share=0.032)) == 2  # 32 of 1000 tokens: two rows of 16
    assert len(batcher.take(token_share=0.0)) == 1
    assert len(batcher.take()) == 7
