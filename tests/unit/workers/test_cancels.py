from shoal.workers.core.cancels import CancelledRequests


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_cancelled_ids_are_remembered_for_their_ttl_and_bounded_in_number() -> None:
    clock = Clock()
    cancels = CancelledRequests(ttl=10, limit=3, clock=clock)
    cancels.add("a")
    clock.now = 5
    cancels.add("b")
    assert "a" in cancels and "b" in cancels and "c" not in cancels
    clock.now = 10.5
    assert "a" not in cancels and "b" in cancels
    cancels.add("c")  # forgets the expired "a"
    assert len(cancels) == 2
    cancels.add("d")
    cancels.add("e")  # over the limit: the oldest ("b") goes
    assert len(cancels) == 3 and "b" not in cancels and "e" in cancels
