"""`perf bakeoff --rounds N`: each target reports its median round, whole, with every
round's tokens/s beside it; one round reports as before."""

from __future__ import annotations

from perf.bakeoff import median_round


def _round(tokens_per_s: float, ttft_ms: float) -> dict:
    return {"tokens_per_s": tokens_per_s, "ttft_p50_ms": ttft_ms, "latency_p50_s": 1.0}


def test_the_median_round_is_reported_whole_with_every_round_beside_it() -> None:
    rounds = [
        {"1": _round(48.3, 50), "32": _round(260.0, 90)},
        {"1": _round(57.2, 41), "32": _round(250.0, 95)},
        {"1": _round(54.0, 45), "32": _round(270.0, 88)},
    ]
    median = median_round(rounds)
    assert median["1"] == {**_round(54.0, 45), "tokens_per_s_each": [48.3, 57.2, 54.0]}
    assert median["32"]["tokens_per_s"] == 260.0 and median["32"]["ttft_p50_ms"] == 90


def test_an_even_count_takes_the_lower_middle_and_one_round_is_as_before() -> None:
    assert median_round([{"1": _round(50, 1)}, {"1": _round(40, 2)}])["1"]["tokens_per_s"] == 40
    assert median_round([{"1": _round(50, 1)}]) == {"1": _round(50, 1)}
