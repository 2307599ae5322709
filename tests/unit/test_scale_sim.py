"""The scale simulator (perf/scale/sim.py): its bookkeeping and the effects it claims."""

from __future__ import annotations

from dataclasses import replace

import pytest

from perf.scale.sim import POLICIES, Cluster, Curve, QueueCosts, Scenario, placement, run_step

CURVE = Curve(0.002, 0.0, 0.00008)
SHORT = [12, 19, 27]
PASSAGES = [230, 256]


def scenario(**fields) -> Scenario:
    base = Scenario(workers=4, models=1, curve=CURVE, short_lengths=SHORT, passage_lengths=PASSAGES)
    return replace(base, **fields)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_is_answered_once_below_capacity(policy: str) -> None:
    result = run_step(scenario(models=3), policy, rate=20, seconds=5)
    assert result.step.sent == 100
    assert result.step.ok == 100 and result.step.errors == 0
    assert 0 < result.utilization < 1


def test_one_request_alone_takes_its_forward_pass_and_the_costs_around_it() -> None:
    queue = QueueCosts(publish_s=0.001, fetch_s=0.002, reply_s=0.0005)
    s = scenario(workers=1, texts=(1, 1), passage_share=0.0, short_lengths=[20], queue=queue)
    cluster = Cluster(s, "pull")
    cluster.offer(1.0, 1.0)
    cluster.want(cluster.workers[0], 0)
    cluster.run(10)
    [(_, seconds)] = cluster.latencies
    # publish + half a fetch (the pull was waiting) + the pass + reply + overhead
    expected = 0.001 + 0.001 + CURVE.seconds(1, 20) + 0.0005 + s.overhead_s
    assert seconds == pytest.approx(expected)


def test_placement_gives_hot_models_more_workers_within_the_slots() -> None:
    s = scenario(workers=8, models=6, resident=2)
    cluster = Cluster(s, "pull")
    hosts = placement(s, cluster.shares, "pull")
    assert all(hosts) and len(hosts[0]) >= len(hosts[-1])
    per_worker = [sum(w in h for h in hosts) for w in range(8)]
    assert max(per_worker) <= 2


def test_pulling_only_when_nearly_free_beats_a_pull_waiting_on_a_busy_worker() -> None:
    """The finding that changed the worker (encoder.schedule.PULL_HORIZON): with mixed
    lengths, a pull kept waiting by a busy worker takes work an idle one could start."""
    s = scenario(workers=8, passage_share=0.2)
    rate = 150.0
    anytime = run_step(replace(s, pull_horizon_s=None), "pull", rate, 20)
    horizon = run_step(s, "pull", rate, 20)
    assert horizon.step.p99_ms < anytime.step.p99_ms / 2


def test_the_worker_rules_are_the_simulation_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator asks the worker's own policy: a worker that never has room for live
    work (no batch may queue) answers nothing in the simulation either."""
    from shoal.workers.encoder import schedule

    s = scenario(workers=2, texts=(1, 1))
    assert run_step(s, "pull", 10, 2).step.ok == 20
    monkeypatch.setattr(schedule, "POOL_BATCHES", 0)
    assert run_step(s, "pull", 10, 2).step.ok == 0
