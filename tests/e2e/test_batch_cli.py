"""`shoal batch` against the live stack: submit --wait downloads the output; errors are
clear and exit non-zero."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_batches import embed_lines, jsonl

pytestmark = pytest.mark.slow


def shoal_batch(base: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shoal", "batch", "--url", base, *args],
        capture_output=True,
        text=True,
        timeout=200,
    )


def test_submit_wait_downloads_the_output_then_status_and_list(stack, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(embed_lines(300, prefix="cli")))
    out = tmp_path / "out.jsonl"
    run = shoal_batch(
        stack, "submit", str(source), "--endpoint", "/v1/embeddings", "--wait", "--output", str(out)
    )
    assert run.returncode == 0, run.stderr
    batch_id = run.stdout.splitlines()[0]
    assert batch_id.startswith("batch_")
    assert "completed" in run.stdout
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(f"cli-{i}" for i in range(300))
    status = shoal_batch(stack, "status", batch_id)
    assert status.returncode == 0
    assert "300 completed, 0 failed of 300" in status.stdout
    assert batch_id in shoal_batch(stack, "list").stdout
    again = tmp_path / "again.jsonl"
    assert shoal_batch(stack, "download", batch_id, "--output", str(again)).returncode == 0
    assert again.read_bytes() == out.read_bytes()


def test_bad_input_exits_non_zero_with_a_clear_message(stack, tmp_path: Path) -> None:
    missing = shoal_batch(stack, "submit", str(tmp_path / "nope.jsonl"), "--endpoint", "/v1/x")
    assert missing.returncode == 1
    assert "no such file" in missing.stderr
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(embed_lines(1)))
    wrong = shoal_batch(stack, "submit", str(source), "--endpoint", "/v1/moderations")
    assert wrong.returncode == 1
    assert "400" in wrong.stderr and "/v1/moderations" in wrong.stderr
    unknown = shoal_batch(stack, "status", "batch_nope")
    assert unknown.returncode == 1
    assert "404" in unknown.stderr
