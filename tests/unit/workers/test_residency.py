import pytest

from shoal.workers.encoder.residency import ModelTooLargeError, Residency

MB = 2**20


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def make(budget: int = 200 * MB, pinned=("pin",)) -> Residency:
    return Residency(budget, pinned, Clock())


def test_a_model_that_fits_evicts_nothing() -> None:
    r = make()
    r.loaded("pin", 90 * MB)
    assert r.plan("a", 90 * MB, busy=set()) == []


def test_least_recently_used_unpinned_models_go_first() -> None:
    r = make(300 * MB)
    r.loaded("pin", 90 * MB)
    r.loaded("a", 90 * MB)
    r.loaded("b", 90 * MB)
    r.touch("a")  # b is now the least recently used
    assert r.plan("c", 90 * MB, busy=set()) == ["b"]
    assert r.plan("c", 180 * MB, busy=set()) == ["b", "a"]


def test_pinned_and_busy_models_are_never_evicted() -> None:
    r = make(200 * MB)
    r.loaded("pin", 90 * MB)
    r.loaded("a", 90 * MB)
    assert r.plan("b", 90 * MB, busy={"a"}) is None  # wait for a to finish
    assert r.plan("b", 90 * MB, busy=set()) == ["a"]


def test_a_model_too_large_even_alone_is_an_error() -> None:
    r = make(200 * MB)
    r.loaded("pin", 90 * MB)
    with pytest.raises(ModelTooLargeError, match="needs about 150 MiB, more than the 110 MiB"):
        r.plan("big", 150 * MB, busy=set())


def test_loads_and_evictions_are_counted() -> None:
    r = make()
    r.loaded("a", 10)
    r.evicted("a")
    r.evicted("a")  # already gone: not counted twice
    assert (r.loads, r.evictions, r.used) == (1, 1, 0)


def test_a_model_that_grows_while_resident_counts_its_new_size() -> None:
    """An engine's second compiled copy (passes side by side) is made after the load."""
    r = make(300 * MB)
    r.loaded("pin", 90 * MB)
    r.loaded("a", 90 * MB)
    r.resized("a", 180 * MB)
    r.resized("gone", 50 * MB)  # not resident: nothing to count
    assert r.used == 270 * MB and "gone" not in r.resident
    assert r.plan("b", 90 * MB, busy=set()) == ["a"]
