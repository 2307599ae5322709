"""The knob search of `shoal tune`, on synthetic score functions and a fake clock.

Each fake measurement advances the clock by a fixed TRIAL_S, so budgets are exact counts
of trials and every run is deterministic.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from itertools import product
from typing import Any

import pytest

from shoal.tune.search import Knob, Trial, best, confirm, mean_scores, search

TRIAL_S = 15.0

TOKENS = Knob("max_batch_tokens", (1024, 2048, 4096, 8192, 16384, 32768))
ITEMS = Knob("max_batch_items", (8, 16, 32, 64, 128, 256))
WAIT = Knob("max_wait_ms", (0, 1, 2, 5, 10, 20))
THREADS = Knob("threads", (1, 2, 4, 8, 16))
DTYPE = Knob("dtype", ("float32", "float16", "bfloat16"), restart=True)
KNOBS = (TOKENS, ITEMS, WAIT, THREADS, DTYPE)

DEFAULT = {
    "max_batch_tokens": 2048,
    "max_batch_items": 16,
    "max_wait_ms": 2,
    "threads": 8,
    "dtype": "float32",
}
OPTIMUM = {
    "max_batch_tokens": 16384,
    "max_batch_items": 64,
    "max_wait_ms": 5,
    "threads": 4,
    "dtype": "float16",
}
DTYPE_FACTOR = {"float32": 0.8, "float16": 1.0, "bfloat16": 0.95}

Score = Callable[[dict[str, Any]], float]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Bench:
    """A fake `measure`: scores with `score`, takes TRIAL_S on the fake clock."""

    def __init__(self, score: Score) -> None:
        self.score = score
        self.clock = FakeClock()
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, candidate: dict[str, Any]) -> tuple[float, Any]:
        self.calls.append(dict(candidate))
        self.clock.now += TRIAL_S
        return self.score(candidate), {"n": len(self.calls)}

    async def run(
        self,
        trials: int,
        knobs: tuple[Knob, ...] = KNOBS,
        default: dict[str, Any] | None = None,
        **kw: Any,
    ) -> list[Trial]:
        return await search(
            knobs,
            dict(DEFAULT if default is None else default),
            self,
            budget_s=trials * TRIAL_S,
            clock=self.clock,
            **kw,
        )


def separable(c: dict[str, Any]) -> float:
    """Unimodal in each knob: 10% lost per step away from OPTIMUM, dtype by a table."""
    score = 1000.0 * DTYPE_FACTOR[c["dtype"]]
    for knob in (TOKENS, ITEMS, WAIT, THREADS):
        distance = abs(knob.values.index(c[knob.name]) - knob.values.index(OPTIMUM[knob.name]))
        score *= 0.9**distance
    return score


def ridge(c: dict[str, Any]) -> float:
    """Throughput peaks when tokens/items = 128 (a diagonal ridge), best at items = 32."""
    log_ratio = math.log2(c["max_batch_tokens"] / c["max_batch_items"])
    on_ridge = math.exp(-((log_ratio - 7) ** 2) / 2)
    along = 0.9 ** abs(math.log2(c["max_batch_items"]) - 5)
    return 1000.0 * on_ridge * along


def flat(c: dict[str, Any]) -> float:
    return 1000.0


def noisy_flat(c: dict[str, Any]) -> float:
    """1000 with deterministic pseudo-noise in [-2%, +2%] (stable across processes)."""
    u = zlib.crc32(repr(sorted(c.items())).encode()) / 0xFFFFFFFF
    return 1000.0 * (1.0 + 0.04 * (u - 0.5))


def grid(knobs: tuple[Knob, ...], default: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {**default, **dict(zip([k.name for k in knobs], vs, strict=True))}
        for vs in product(*(k.values for k in knobs))
    ]


def keys(trials: list[Trial]) -> list[tuple[Any, ...]]:
    return [tuple(sorted(t.candidate.items())) for t in trials]


async def test_separable_unimodal_finds_exact_optimum() -> None:
    bench = Bench(separable)
    trials = await bench.run(30)  # the grid has 6*6*6*5*3 = 3240 candidates
    assert best(trials).candidate == OPTIMUM
    assert trials[0].candidate == DEFAULT and trials[0].phase == "default"
    assert {t.phase for t in trials[1:]} <= {"coarse", "refine"}
    assert sum(t.seconds for t in trials) <= 30 * TRIAL_S


async def test_ample_budget_stops_at_a_local_optimum() -> None:
    bench = Bench(separable)
    trials = await bench.run(500)
    assert len(trials) < 60
    # It stopped because every move from the optimum was tried and none improved.
    top = best(trials)
    assert top.candidate == OPTIMUM
    assert all(t.score < top.score for t in trials[trials.index(top) + 1 :])


async def test_default_off_the_list_has_nearest_values_as_neighbours() -> None:
    bench = Bench(lambda c: separable({**c, "max_batch_tokens": _snap(c["max_batch_tokens"])}))
    default = {**DEFAULT, "max_batch_tokens": 3000}
    trials = await bench.run(40, default=default)
    assert trials[0].candidate["max_batch_tokens"] == 3000
    assert best(trials).candidate == OPTIMUM


def _snap(tokens: int) -> int:
    return min(TOKENS.values, key=lambda v: abs(v - tokens))


async def test_interaction_ridge_reaches_optimum_within_two_percent() -> None:
    knobs = (TOKENS, ITEMS, WAIT)
    default = {**DEFAULT, "max_batch_tokens": 1024, "max_batch_items": 128}
    bench = Bench(ridge)
    trials = await bench.run(40, knobs=knobs, default=default)
    top = max(ridge(c) for c in grid(knobs, default))
    assert ridge(default) < 0.01 * top  # starts far off the ridge
    assert best(trials).score >= 0.98 * top


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
async def test_budget_is_respected(n: int) -> None:
    bench = Bench(separable)
    trials = await bench.run(n)
    assert len(trials) <= n
    assert len(bench.calls) == len(trials)
    assert sum(t.seconds for t in trials) <= n * TRIAL_S
    # The search stops only for the budget here (separable keeps improving for longer).
    assert len(trials) == n


async def test_budget_not_a_whole_number_of_trials() -> None:
    bench = Bench(separable)
    trials = await search(KNOBS, dict(DEFAULT), bench, budget_s=5.9 * TRIAL_S, clock=bench.clock)
    assert len(trials) == 5


async def test_a_trial_longer_than_the_rest_keeps_later_ones_inside_the_budget() -> None:
    """Trials of 10, 10, 40, 40 s (a restart with more sequences takes longer): after
    three, the mean (20 s) would start a fourth at 60 s of an 85 s budget, to end at
    100 s; the longest so far (40 s) does not start it."""
    bench = Bench(separable)
    durations = iter([10.0, 10.0] + [40.0] * 20)

    async def uneven(candidate: dict[str, Any]) -> tuple[float, Any]:
        score, detail = await bench(candidate)
        bench.clock.now += next(durations) - TRIAL_S
        return score, detail

    trials = await search(KNOBS, dict(DEFAULT), uneven, budget_s=85.0, clock=bench.clock)
    assert sum(t.seconds for t in trials) <= 85.0
    assert len(trials) == 3


async def test_a_failed_slow_trial_does_not_end_the_search() -> None:
    """A candidate whose worker never came up fails after 100 s; the 10 s trials that
    measured something still set the pace, so the search goes on within its budget."""
    bench = Bench(separable)
    calls = 0

    async def one_fails_slowly(candidate: dict[str, Any]) -> tuple[float, Any]:
        nonlocal calls
        calls += 1
        score, detail = await bench(candidate)
        slow = calls == 2
        bench.clock.now += (100.0 if slow else 10.0) - TRIAL_S
        return (0.0 if slow else score), detail

    trials = await search(KNOBS, dict(DEFAULT), one_fails_slowly, budget_s=150.0, clock=bench.clock)
    assert trials[1].score == 0.0
    assert len(trials) == 6  # 10 + 100 + 4 x 10 s
    assert sum(t.seconds for t in trials) <= 150.0


async def test_default_runs_even_when_the_budget_is_smaller_than_a_trial() -> None:
    bench = Bench(separable)
    trials = await search(KNOBS, dict(DEFAULT), bench, budget_s=1.0, clock=bench.clock)
    assert [t.phase for t in trials] == ["default"]


@pytest.mark.parametrize("score", [separable, ridge, flat, noisy_flat])
async def test_no_candidate_is_measured_twice(score: Score) -> None:
    bench = Bench(score)
    trials = await bench.run(500)
    assert len(set(keys(trials))) == len(trials)
    assert len(bench.calls) == len(trials)


async def test_flat_function_stops_on_its_own() -> None:
    bench = Bench(flat)
    trials = await bench.run(500)
    assert len(trials) < 500
    # Nothing beats the default: the coarse probes plus one neighbourhood of it.
    assert best(trials) is trials[0]


async def test_noise_below_min_gain_does_not_wander() -> None:
    quiet = await Bench(flat).run(500)
    bench = Bench(noisy_flat)
    trials = await bench.run(500)
    # It stops long before the budget: +-2% noise can beat the incumbent by more than
    # 3% at most once (after that the incumbent is >1009, and 1009 * 1.03 > 1020), so
    # the search explores at most one more neighbourhood than on the noise-free surface.
    assert len(trials) <= 2 * len(quiet)
    assert bench.clock.now - 1000.0 < 100 * TRIAL_S
    # And it stays near the default: every knob within two steps of it.
    for t in trials:
        for knob in KNOBS:
            if knob.restart:
                continue
            steps = abs(
                knob.values.index(t.candidate[knob.name]) - knob.values.index(DEFAULT[knob.name])
            )
            spread = {knob.values[0], knob.values[(len(knob.values) - 1) // 2], knob.values[-1]}
            assert steps <= 2 or t.candidate[knob.name] in spread


async def test_failing_candidates_are_never_best() -> None:
    def oom(c: dict[str, Any]) -> float:
        # The optimum's tokens (16384) and above fail, and would score best.
        if c["max_batch_tokens"] >= 16384:
            return 0.0
        return separable(c)

    bench = Bench(oom)
    trials = await bench.run(60)
    assert any(t.score == 0.0 for t in trials)  # it did try the failing region
    top = best(trials)
    assert top.score > 0.0
    assert top.candidate == {**OPTIMUM, "max_batch_tokens": 8192}


async def test_measure_raising_is_a_failed_trial() -> None:
    def crash(c: dict[str, Any]) -> float:
        if c["dtype"] == "float16":
            raise RuntimeError("worker died")
        return separable(c)

    bench = Bench(crash)
    trials = await bench.run(60)
    failed = [t for t in trials if t.candidate["dtype"] == "float16"]
    assert failed and all(t.score == 0.0 for t in failed)
    assert all(isinstance(t.detail, RuntimeError) for t in failed)
    assert best(trials).candidate["dtype"] == "bfloat16"


async def test_restart_knob_changes_last() -> None:
    bench = Bench(separable)
    trials = await bench.run(500)
    coarse = [t for t in trials if t.phase == "coarse"]
    varied = [t.candidate["dtype"] != DEFAULT["dtype"] for t in coarse]
    # All coarse probes of dtype come after every cheap coarse probe.
    first = varied.index(True)
    assert all(varied[first:])
    # Refinement tries a dtype step only after every cheap move from the incumbent
    # failed; the incumbent is the optimum by then, so those trials end the run.
    top = best(trials)
    refine = [t for t in trials if t.phase == "refine"]
    changed = [t.candidate["dtype"] != top.candidate["dtype"] for t in refine]
    assert changed.count(True) == 2  # float16's two neighbours
    assert changed[-2:] == [True, True]


async def test_on_trial_reports_each_trial_in_order() -> None:
    seen: list[Trial] = []
    bench = Bench(separable)
    trials = await bench.run(10, on_trial=seen.append)
    assert seen == trials
    assert [t.detail["n"] for t in seen] == list(range(1, len(trials) + 1))
    assert all(t.seconds == TRIAL_S for t in trials)


async def test_min_gain_zero_follows_any_improvement() -> None:
    bench = Bench(lambda c: 1000.0 + THREADS.values.index(c["threads"]))
    trials = await bench.run(100, knobs=(THREADS,), min_gain=0.0)
    assert best(trials).candidate["threads"] == 16


async def test_invalid_arguments() -> None:
    bench = Bench(flat)
    with pytest.raises(ValueError, match="no value for knob"):
        await search(KNOBS, {"threads": 1}, bench, budget_s=100, clock=bench.clock)
    with pytest.raises(ValueError, match="duplicate"):
        await search((WAIT, WAIT), DEFAULT, bench, budget_s=100, clock=bench.clock)
    with pytest.raises(ValueError, match="no values"):
        await search((Knob("x", ()),), {"x": 1}, bench, budget_s=100, clock=bench.clock)
    assert bench.calls == []


def test_best_picks_highest_earliest_on_ties() -> None:
    trials = [
        Trial({"a": 1}, 10.0),
        Trial({"a": 2}, 30.0),
        Trial({"a": 3}, 0.0),
        Trial({"a": 4}, 30.0),
        Trial({"a": 5}, 20.0),
    ]
    assert best(trials) is trials[1]
    assert best([Trial({"a": 1}, 0.0)]).candidate == {"a": 1}
    with pytest.raises(ValueError):
        best([])


def test_mean_scores_judges_a_candidate_on_all_its_runs() -> None:
    trials = [
        Trial({"a": 1}, 100.0),
        Trial({"a": 2}, 130.0),  # lucky once ...
        Trial({"a": 3}, 120.0),
        Trial({"a": 2}, 90.0, phase="confirm"),  # ... not twice: mean 110
        Trial({"a": 3}, 118.0, phase="confirm"),
    ]
    assert mean_scores(trials) == [({"a": 3}, 119.0), ({"a": 2}, 110.0), ({"a": 1}, 100.0)]
    ties = [Trial({"a": 1}, 5.0), Trial({"a": 2}, 5.0)]
    assert [c for c, _ in mean_scores(ties)] == [{"a": 1}, {"a": 2}]


async def test_confirm_remeasures_the_top_candidates_while_they_fit() -> None:
    noisy = {3: 130.0, 2: 120.0, 1: 110.0, 0: 0.0}
    trials = [Trial({"a": a}, s, seconds=TRIAL_S) for a, s in noisy.items()]
    bench = Bench(lambda c: 100.0 + c["a"])
    extra = await confirm(trials, bench, deadline=bench.clock.now + 2.5 * TRIAL_S,
                          clock=bench.clock)  # fmt: skip
    # Two fit before the deadline, best first; a failed candidate is never re-measured.
    assert [t.candidate for t in extra] == [{"a": 3}, {"a": 2}]
    assert all(t.phase == "confirm" for t in extra)
    assert [c for c, _ in mean_scores([*trials, *extra])][:2] == [{"a": 3}, {"a": 2}]
    everything = await confirm(trials, bench, deadline=bench.clock.now + 100 * TRIAL_S,
                               clock=bench.clock, top=5)  # fmt: skip
    assert [t.candidate["a"] for t in everything] == [3, 2, 1]
