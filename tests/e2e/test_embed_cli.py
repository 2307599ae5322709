"""`shoal embed` against a live server: text, JSONL and Parquet inputs of 10,000 rows,
equal to the native client's vectors; interrupted with SIGINT and resumed, complete with
no duplicate; bad input exits non-zero with a clear message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shoal.client import Client
from tests.helpers import MODEL

pytestmark = pytest.mark.slow

ROWS = 10_000
TEXTS = [f"row {i} of the shoal" for i in range(ROWS)]
SAMPLE = [*range(0, ROWS, 211), ROWS - 1]


def shoal_embed(base: str, *args: str | Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "shoal", "embed", "--url", base, "--model", MODEL]
    return subprocess.Popen(
        [*command, *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 200) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


@pytest.fixture(scope="module")
def expected(stack: str) -> np.ndarray:
    with Client(stack) as client:
        return client.embed([TEXTS[i] for i in SAMPLE], model=MODEL)


def test_text_jsonl_and_parquet_inputs_give_the_clients_vectors(
    stack: str, tmp_path: Path, expected: np.ndarray
) -> None:
    text = tmp_path / "in.txt"
    text.write_text("".join(t + "\n" for t in TEXTS))
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text(
        "".join(json.dumps({"doc": t, "key": f"k{i}"}) + "\n" for i, t in enumerate(TEXTS))
    )
    parquet = tmp_path / "in.parquet"
    pq.write_table(pa.table({"body": TEXTS}), parquet, row_group_size=3000)

    code, err = finish(shoal_embed(stack, text, "-o", tmp_path / "a.npy"))
    assert code == 0, err
    vectors = np.load(tmp_path / "a.npy")
    assert vectors.shape == (ROWS, 384)
    assert np.allclose(vectors[SAMPLE], expected, atol=1e-5)

    code, err = finish(
        shoal_embed(stack, jsonl, "--field", "doc", "--id", "key", "-o", tmp_path / "b.parquet")
    )
    assert code == 0, err
    table = pq.read_table(tmp_path / "b.parquet")
    assert table.column("id").to_pylist() == [f"k{i}" for i in range(ROWS)]
    got = np.array(table.column("embedding").to_pylist(), dtype=np.float32)
    assert np.allclose(got[SAMPLE], expected, atol=1e-5)

    code, err = finish(
        shoal_embed(
            stack, parquet, "--column", "body", "--dtype", "float16", "-o", tmp_path / "c.npy"
        )
    )
    assert code == 0, err
    half = np.load(tmp_path / "c.npy")
    assert half.dtype == np.float16
    assert np.allclose(half[SAMPLE].astype(np.float32), expected, atol=2e-3)


def test_sigint_then_resume_completes_with_no_duplicate(
    stack: str, tmp_path: Path, expected: np.ndarray
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": t, "n": i}) + "\n" for i, t in enumerate(TEXTS)))
    out = tmp_path / "out.parquet"
    args = (source, "--id", "n", "--batch-size", "64", "--concurrency", "2", "-o", out)
    first = shoal_embed(stack, *args)
    parts = tmp_path / "out.parquet.progress"
    deadline = time.monotonic() + 300
    while not parts.exists() and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    assert first.poll() is None, "the run ended before it could be interrupted"
    first.send_signal(signal.SIGINT)
    code, err = finish(first)
    assert code == 130, err
    assert "--resume" in err
    saved = json.loads(parts.read_text())["rows"]
    assert 0 < saved < ROWS

    code, err = finish(shoal_embed(stack, *args, "--resume"))
    assert code == 0, err
    assert f"resuming at row {saved}" in err
    table = pq.read_table(out)
    ids = table.column("id").to_pylist()
    assert ids == [str(i) for i in range(ROWS)]  # every row once, in order
    got = np.array(table.column("embedding").to_pylist(), dtype=np.float32)
    assert np.allclose(got[SAMPLE], expected, atol=1e-5)
    assert not parts.exists()


def test_bad_input_exits_non_zero_with_a_clear_message(stack: str, tmp_path: Path) -> None:
    csv = tmp_path / "in.csv"
    csv.write_text("title,body\na,b\n")
    code, err = finish(shoal_embed(stack, csv, "--column", "text", "-o", tmp_path / "x.npy"))
    assert code == 2
    assert "no column 'text' (columns: title, body)" in err
    code, err = finish(shoal_embed(stack, tmp_path / "missing.txt", "-o", tmp_path / "x.npy"))
    assert code == 2
    assert "no such file" in err
    (tmp_path / "y.npy").write_bytes(b"")
    text = tmp_path / "ok.txt"
    text.write_text("hello\n")
    code, err = finish(shoal_embed(stack, text, "-o", tmp_path / "y.npy"))
    assert code == 2
    assert "exists; pass --overwrite" in err
    assert not list(tmp_path.glob("x.npy*"))
