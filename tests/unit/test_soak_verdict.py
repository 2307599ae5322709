"""The soak's verdict on its own figures (perf/soak.py): RSS growth judged on 5-minute
medians, not two single samples; each route's p99 over every calm answer of a window."""

from __future__ import annotations

import math

from perf.soak import SHARES, _growth, _p99_windows, verdict
from perf.soak_load import Sent


def _life(start: float, minutes: float, trend: float, swing: float) -> list[tuple[float, int]]:
    """RSS every 10 s: 100 MiB, rising by `trend` over the life, swinging by `swing`
    (a garbage collector's swing with a 2.5-minute period)."""
    n = int(minutes * 6)
    return [
        (
            start + 10 * i,
            int(102_400 * (1 + trend * i / n + swing * math.sin(2 * math.pi * i / 15))),
        )
        for i in range(n)
    ]


def test_a_swinging_heap_without_a_trend_has_not_grown() -> None:
    life = _life(0, 50, trend=0.0, swing=0.04)
    # Two single samples, a trough and a peak, differ by 8%: the old verdict's reading.
    assert max(rss for _, rss in life) / min(rss for _, rss in life) > 1.07
    assert abs(_growth(life)) < 0.02


def test_a_steady_leak_is_seen_through_the_swing() -> None:
    grew = _growth(_life(0, 50, trend=0.10, swing=0.04))
    assert 0.05 < grew < 0.10  # from minute 10 on: about 8% of the 10% trend


def test_the_first_ten_minutes_of_a_life_are_not_judged() -> None:
    assert _growth(_life(120, 10, trend=0.5, swing=0.0)) is None
    warm = [(t, 50_000 if t < 720 else 100_000) for t, _ in _life(120, 30, 0.0, 0.0)]
    assert _growth(warm) == 0.0  # doubled while warming up, flat after


def _window_report(first: list[float], last: list[float], faulted: list[float]) -> dict:
    minutes = 30
    sent = [Sent("chat", 60 + i, seconds, 200) for i, seconds in enumerate(first)]
    sent += [Sent("chat", 1300 + i, seconds, 200) for i, seconds in enumerate(last)]
    calm = list(sent)
    sent += [Sent("chat", 1400 + i, seconds, 200) for i, seconds in enumerate(faulted)]
    return {
        "minutes": minutes,
        "problem_count": 0,
        "failed_outside_count": 0,
        "batch": {"lines": 0},
        "faults": [],
        "samples": [],
        "p99_windows": _p99_windows(calm, minutes * 60),
    }


def test_p99_is_over_every_calm_answer_of_each_window() -> None:
    report = _window_report([1.0] * 98 + [5.0] * 2, [1.0] * 200, faulted=[30.0] * 50)
    chat = report["p99_windows"]["chat"]
    assert chat["first"] == {"n": 100, "p99": 5.0} and chat["last"] == {"n": 200, "p99": 1.0}
    assert set(report["p99_windows"]) == set(SHARES)
    assert verdict(report) == []


def test_a_slower_last_window_misses_the_bar() -> None:
    report = _window_report([1.0] * 100, [1.0] * 90 + [1.5] * 10, faulted=[])
    assert verdict(report) == ["chat: p99 1.50 s in the last 10 min against 1.00 s"]
