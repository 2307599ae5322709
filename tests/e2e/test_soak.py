"""Three minutes of the soak (perf/soak.py) with two faults: the accounting, not timings.
Every answer that came back 2xx is whole, every batch line is answered once, every route
answers again after each fault, and nothing fails outside the faults' windows."""

from __future__ import annotations

import asyncio
from pathlib import Path

from perf.soak import Cluster, soak, verdict


def test_three_minutes_with_a_worker_and_the_gateway_killed(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        cluster.start()
        report = asyncio.run(
            soak(cluster, minutes=3, rate=6, faults=["encoder", "gateway"], lines=40)
        )
    finally:
        cluster.stop()
    assert report["sent"] >= 900, report["totals"]
    assert report["problem_count"] == 0, report["problems"][:10]
    assert report["failed_outside_count"] == 0, report["failed_outside_faults"][:10]
    assert report["batch"]["answered_once"], report["batch"]
    assert [f["fault"] for f in report["faults"]] == ["encoder", "gateway"]
    for fault in report["faults"]:  # every route answered again after it
        assert fault["recovery_s"] is not None, fault
    # The verdict's only checks at this length are the accounting's and recoveries.
    misses = [m for m in verdict(report) if "recovery" not in m]
    assert not misses, misses
