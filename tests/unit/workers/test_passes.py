"""The pass planner: one pass alone at low load, two side by side once the forward passes
have kept the worker busy, back to one at a time when the load falls; never a pass beside
one that runs alone, never more than two, never on an engine or op that cannot."""

from __future__ import annotations

from shoal.workers.encoder.passes import Pass, PassPlanner


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _run(planner: PassPlanner, clock: Clock, mode: Pass, seconds: float) -> None:
    planner.started(mode)
    clock.now += seconds
    planner.computed(mode)
    planner.ended(mode)


def _busy_for(planner: PassPlanner, clock: Clock, seconds: float) -> None:
    """A worker at its knee: passes back to back, alone or two side by side."""
    end = clock.now + seconds
    while clock.now < end:
        mode = planner.next(may_pair=True)
        assert mode is not None
        planner.started(mode)
        modes = [mode]
        if planner.next(may_pair=True) is Pass.BESIDE:
            planner.started(Pass.BESIDE)
            modes.append(Pass.BESIDE)
        clock.now += 0.05 * len(modes)
        for started in modes:
            planner.computed(started)
            planner.ended(started)


def test_at_low_load_each_pass_runs_alone_and_blocks_the_next() -> None:
    clock = Clock()
    planner = PassPlanner(clock, pairs=True)
    for _ in range(40):  # a 50 ms pass every 200 ms: a quarter busy
        assert planner.next(may_pair=True) is Pass.ALONE
        planner.started(Pass.ALONE)
        assert planner.next(may_pair=True) is None and not planner.has_room()
        clock.now += 0.05
        planner.computed(Pass.ALONE)
        clock.now += 0.01  # its answers are sent: still in place, not computing
        assert planner.next(may_pair=True) is None
        planner.ended(Pass.ALONE)
        clock.now += 0.14
    assert not planner.pairing and 0.15 < planner.busy < 0.4
    assert planner.side_by_side == 0


def test_under_sustained_load_passes_pair_up_to_two() -> None:
    clock = Clock()
    planner = PassPlanner(clock, pairs=True)
    _busy_for(planner, clock, 1.0)  # one time constant busy: not yet past `enter`
    assert not planner.pairing
    _busy_for(planner, clock, 2.0)
    assert planner.pairing
    paired_before = planner.side_by_side
    assert planner.next(may_pair=True) is Pass.BESIDE
    planner.started(Pass.BESIDE)
    assert planner.has_room()
    assert planner.next(may_pair=False) is None  # a LoRA batch waits for the pair to end
    assert planner.next(may_pair=True) is Pass.BESIDE
    planner.started(Pass.BESIDE)
    assert planner.next(may_pair=True) is None and not planner.has_room()
    assert planner.side_by_side == paired_before + 1
    clock.now += 0.1
    planner.computed(Pass.BESIDE)
    planner.ended(Pass.BESIDE)
    assert planner.next(may_pair=True) is Pass.BESIDE
    planner.computed(Pass.BESIDE)
    planner.ended(Pass.BESIDE)
    # With nothing running, what cannot pair runs alone even while pairing.
    assert planner.next(may_pair=False) is Pass.ALONE


def test_when_the_load_falls_passes_run_alone_again() -> None:
    clock = Clock()
    planner = PassPlanner(clock, pairs=True)
    _busy_for(planner, clock, 3.0)
    assert planner.pairing
    clock.now += 0.2  # a short lull keeps the pairing (no flapping at the boundary)
    assert planner.next(may_pair=True) is Pass.BESIDE
    clock.now += 1.0
    assert planner.next(may_pair=True) is Pass.ALONE and not planner.pairing


def test_a_worker_that_may_not_pair_never_does() -> None:
    clock = Clock()
    planner = PassPlanner(clock, pairs=False)  # a GPU, or one thread
    _busy_for(planner, clock, 4.0)
    assert planner.busy > 0.95 and not planner.pairing
    assert planner.next(may_pair=True) is Pass.ALONE


def test_one_stream_busy_beside_nothing_is_not_load_enough_to_stay_paired() -> None:
    """Half the knee while pairing: passes come one at a time on half the threads, each
    taking twice as long; that is the load of a pass alone busy half the time."""
    clock = Clock()
    planner = PassPlanner(clock, pairs=True)
    _busy_for(planner, clock, 3.0)
    assert planner.pairing
    for _ in range(40):  # a batch every 0.1 s, 0.05 s of work alone
        mode = planner.next(may_pair=True)
        assert mode is not None
        _run(planner, clock, mode, 0.1 if mode is Pass.BESIDE else 0.05)
        clock.now += 0 if mode is Pass.BESIDE else 0.05
    assert not planner.pairing and planner.next(may_pair=True) is Pass.ALONE
