"""A pytest plugin that runs only the tests named in the file $KEEP_IDS (one node id a line,
as `pytest --collect-only -q` prints them), so two trees of the suite are timed on the same
tests (perf/results/README.md, "The whole suite against the tree issue #38 was filed on"):

    pytest --collect-only -q | grep :: | sort > new.txt   # in each tree; then
    comm -12 old.txt new.txt > common.txt
    KEEP_IDS=common.txt PYTHONPATH=<tree>:<this tree>/perf .venv/bin/pytest -p keep_ids ...
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    with open(os.environ["KEEP_IDS"]) as listed:
        keep = {line.rstrip("\n") for line in listed if line.strip()}
    dropped = [item for item in items if item.nodeid not in keep]
    items[:] = [item for item in items if item.nodeid in keep]
    config.hook.pytest_deselected(items=dropped)
