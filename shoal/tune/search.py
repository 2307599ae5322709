"""The search over a model's batching knobs that `shoal tune` runs.

A measurement is a load test against a live worker: slow (10-20 s) and noisy (+-5-10%),
and a typical budget (`--budget 2m`) buys well under ten of them. So the search is a
greedy one that spends every trial next to the best profile so far:

1. default: the current profile, measured first; it is the baseline every gain is
   measured against, and it always runs, whatever the budget.
2. coarse: coordinate-wise. For each knob in turn, its low, middle and high values, the
   other knobs held at the incumbent (the best so far), which moves as soon as a probe
   beats it. Chosen over a space-filling design because (a) batching knobs are mostly
   separable, so one knob at a time finds the right region of each; (b) a handful of
   space-filling points in five dimensions say little, and each would change every knob
   at once, dtype included; (c) every probe differs from a profile already measured in
   one knob only, so a budget that runs out at any point still leaves the best of them.
3. refine: first-improvement hill-climb from the incumbent. A move is one knob one step
   to a neighbouring value; the knob and direction that last improved are tried first (a
   slope tends to continue). When no single step improves, pairs of knobs step together,
   same direction first: tokens and items caps interact (a bigger batch needs both), and
   such a ridge runs diagonally, where single steps all fall off it. The climb ends when
   no move improves or the budget runs out.

A move counts as an improvement only when it beats the incumbent by more than `min_gain`
(relative): smaller gains are within the noise, and chasing them would wander the search
off along noise instead of signal. No candidate is measured twice (the answer would be
noise again, at the price of a full trial).

Knobs with `restart=True` (dtype: changing it restarts the worker and reloads the model)
are varied sparingly: in the coarse phase they come after every cheap knob, and in the
refinement they take single steps only, tried after every cheap single and pair move has
failed. So they change only when everything cheap has been tried from the incumbent.

Budget: a trial is started only when the elapsed time plus the longest trial so far
that measured something still fits in `budget_s` (not the mean: a generation trial that
restarts the worker with more sequences takes longer than the ones before it, and the mean
let the last trial run past the budget on a loaded machine; not a failed trial's, which
can wait minutes for a worker that never comes up); the default trial always runs.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

__all__ = ["Knob", "Trial", "best", "confirm", "mean_scores", "search"]

Candidate = dict[str, Any]
Measure = Callable[[Candidate], Awaitable[tuple[float, Any]]]


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple[Any, ...]
    """Ordered: neighbouring values are adjacent."""
    restart: bool = False
    """Changing this knob is expensive (e.g. it restarts the worker): change it rarely."""


@dataclass
class Trial:
    candidate: Candidate
    score: float
    """Higher is better; 0.0 for a failed or invalid candidate."""
    detail: Any = None
    seconds: float = 0.0
    phase: str = ""
    """"default", "coarse" or "refine"."""


def best(trials: Sequence[Trial]) -> Trial:
    """The highest-scoring trial; on a tie, the earliest."""
    if not trials:
        raise ValueError("no trials")
    # max() keeps the first of equal keys, which is the earliest trial.
    return max(trials, key=lambda t: t.score)


def mean_scores(trials: Sequence[Trial]) -> list[tuple[Candidate, float]]:
    """Each candidate measured, with the mean of its scores, best first; on a tie, the
    first measured. A candidate measured again (`confirm`) is judged on all its runs."""
    runs: dict[Hashable, tuple[Candidate, list[float]]] = {}
    for trial in trials:
        runs.setdefault(_key(trial.candidate), (trial.candidate, []))[1].append(trial.score)
    means = [(candidate, sum(scores) / len(scores)) for candidate, scores in runs.values()]
    return sorted(means, key=lambda pair: -pair[1])  # stable: ties keep the first measured


async def confirm(
    trials: Sequence[Trial],
    measure: Measure,
    *,
    deadline: float,
    top: int = 3,
    clock: Callable[[], float] = time.monotonic,
    on_trial: Callable[[Trial], None] | None = None,
) -> list[Trial]:
    """Measure the `top` candidates once more while each fits before `deadline`: on a busy
    machine one measurement can rank a lucky candidate first."""
    longest = _longest(trials)
    extra: list[Trial] = []
    for candidate, score in mean_scores(trials)[:top]:
        if score <= 0 or clock() + longest > deadline:
            break
        extra.append(await _measured(measure, candidate, "confirm", clock))
        if on_trial is not None:
            on_trial(extra[-1])
    return extra


def _longest(trials: Sequence[Trial]) -> float:
    """What the next trial may take: the longest that measured something (a failed one
    can take far longer, waiting for a worker that never came up)."""
    measured = [t.seconds for t in trials if t.score > 0] or [t.seconds for t in trials]
    return max(measured, default=0.0)


async def search(
    knobs: Sequence[Knob],
    default: Candidate,
    measure: Measure,
    *,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
    on_trial: Callable[[Trial], None] | None = None,
    min_gain: float = 0.03,
) -> list[Trial]:
    """Search `knobs` from `default` within `budget_s`; every trial, in the order run.

    `measure` scores a candidate (the default with some knobs changed; keys of `default`
    that are not knobs pass through unchanged). An exception from `measure` counts as a
    failed candidate (score 0.0, the exception as its detail): a profile that crashes the
    worker is a bad profile, not a reason to lose the trials already run.
    """
    _check(knobs, default, min_gain)
    cheap = [k for k in knobs if not k.restart]
    costly = [k for k in knobs if k.restart]
    start = clock()
    trials: list[Trial] = []
    seen: set[Hashable] = set()

    async def run(candidate: Candidate, phase: str) -> Trial:
        seen.add(_key(candidate))
        trial = await _measured(measure, candidate, phase, clock)
        trials.append(trial)
        if on_trial is not None:
            on_trial(trial)
        return trial

    def fits() -> bool:
        return clock() - start + _longest(trials) <= budget_s

    incumbent = await run(dict(default), "default")

    async def improves(candidate: Candidate, phase: str) -> bool:
        """Measure `candidate` unless it was measured before; whether it beat the
        incumbent by more than `min_gain` (it is then the incumbent). Raises
        `_BudgetSpent` when another trial would not fit."""
        nonlocal incumbent
        if _key(candidate) in seen:
            return False
        if not fits():
            raise _BudgetSpent
        trial = await run(candidate, phase)
        if trial.score <= 0.0 or trial.score <= incumbent.score * (1.0 + min_gain):
            return False
        incumbent = trial
        return True

    try:
        # Coarse: one knob at a time, cheap knobs first, others at the incumbent.
        for knob in (*cheap, *costly):
            for value in _spread(knob.values):
                await improves({**incumbent.candidate, knob.name: value}, "coarse")

        # Refine: first-improvement hill-climb. `directions` holds each knob's last
        # improving step (-1/+1), `recent` the cheap knob that moved in the last one.
        directions: dict[str, int] = {}
        recent: str | None = None
        while True:
            at = incumbent.candidate
            for candidate in _moves(at, cheap, costly, directions, recent):
                if await improves(candidate, "refine"):
                    recent = _remember(directions, at, candidate, cheap, costly)
                    break
            else:
                return trials
    except _BudgetSpent:
        return trials


class _BudgetSpent(Exception):
    """Another trial would not fit in the search's budget."""


def _check(knobs: Sequence[Knob], default: Candidate, min_gain: float) -> None:
    names = [k.name for k in knobs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate knob names: {names}")
    for knob in knobs:
        if not knob.values:
            raise ValueError(f"knob {knob.name!r} has no values")
        if knob.name not in default:
            raise ValueError(f"default profile has no value for knob {knob.name!r}")
    if min_gain < 0:
        raise ValueError("min_gain must be >= 0")


async def _measured(
    measure: Measure, candidate: Candidate, phase: str, clock: Callable[[], float]
) -> Trial:
    t0 = clock()
    try:
        score, detail = await measure(dict(candidate))
    except Exception as exc:
        score, detail = 0.0, exc
    return Trial(dict(candidate), float(score), detail, clock() - t0, phase)


def _key(candidate: Candidate) -> Hashable:
    # Keys are distinct strings, so sorting never compares the values themselves.
    return tuple(sorted(candidate.items()))


def _spread(values: tuple[Any, ...]) -> list[Any]:
    """Low, middle and high: three probes cover the range of a knob of any length."""
    picks = [0, (len(values) - 1) // 2, len(values) - 1]
    return [values[i] for i in dict.fromkeys(picks)]


def _neighbours(knob: Knob, value: Any) -> list[tuple[int, Any]]:
    """(direction, value) one step from `value`: -1 down, +1 up, 0 when unordered.

    A value off the knob's list (the user's own profile) has the nearest listed value on
    each side as its neighbours; one that cannot be compared with the list has every
    listed value as a neighbour, with no direction.
    """
    values = knob.values
    if value in values:
        i = values.index(value)
        steps = [(-1, i - 1), (+1, i + 1)]
        return [(d, values[j]) for d, j in steps if 0 <= j < len(values)]
    try:
        below = [v for v in values if v < value]
        above = [v for v in values if v > value]
    except TypeError:
        return [(0, v) for v in values]
    out: list[tuple[int, Any]] = []
    if below:
        out.append((-1, max(below)))
    if above:
        out.append((+1, min(above)))
    return out


def _toward(moves: list[tuple[int, Any]], preferred: int | None) -> list[tuple[int, Any]]:
    """The neighbour in the direction that last improved first."""
    if preferred is None:
        return moves
    return sorted(moves, key=lambda m: m[0] != preferred)


def _moves(
    at: Candidate,
    cheap: list[Knob],
    costly: list[Knob],
    directions: dict[str, int],
    recent: str | None,
) -> Iterator[Candidate]:
    """Candidates one move from `at`, most promising first (see the module docstring)."""
    singles = sorted(cheap, key=lambda k: k.name != recent)  # stable: else knob order

    def steps(knob: Knob) -> list[tuple[int, Any]]:
        return _toward(_neighbours(knob, at[knob.name]), directions.get(knob.name))

    for knob in singles:
        for _, value in steps(knob):
            yield {**at, knob.name: value}
    for a, b in combinations(cheap, 2):
        steps_a = {d: v for d, v in _neighbours(a, at[a.name]) if d}
        steps_b = {d: v for d, v in _neighbours(b, at[b.name]) if d}
        lead = directions.get(a.name, +1)
        for da, db in ((lead, lead), (-lead, -lead), (lead, -lead), (-lead, lead)):
            if da in steps_a and db in steps_b:
                yield {**at, a.name: steps_a[da], b.name: steps_b[db]}
    for knob in costly:
        for _, value in steps(knob):
            yield {**at, knob.name: value}


def _remember(
    directions: dict[str, int],
    before: Candidate,
    after: Candidate,
    cheap: list[Knob],
    costly: list[Knob],
) -> str | None:
    """Record which way each moved knob went; the cheap knob that moved, if one did."""
    moved: str | None = None
    for knob in (*costly, *cheap):
        old, new = before[knob.name], after[knob.name]
        if old == new:
            continue
        direction = next((d for d, v in _neighbours(knob, old) if v == new), 0)
        if direction:
            directions[knob.name] = direction
        if not knob.restart:
            moved = knob.name
    return moved
