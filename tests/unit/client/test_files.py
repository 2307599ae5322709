"""`shoal embed`'s readers and writers on real files: formats, bad input, resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shoal.client.sinks import SinkError, open_sink
from shoal.client.sources import Source, SourceError

TEXTS = [f"text number {i}" for i in range(10)]
RUN = {"model": "m", "total": 10}


def write_inputs(tmp_path: Path) -> dict[str, Path]:
    paths = {
        "txt": tmp_path / "in.txt",
        "jsonl": tmp_path / "in.jsonl",
        "csv": tmp_path / "in.csv",
        "parquet": tmp_path / "in.parquet",
    }
    paths["txt"].write_text("".join(t + "\n" for t in TEXTS))
    paths["jsonl"].write_text(
        "".join(json.dumps({"id": f"k{i}", "body": t}) + "\n" for i, t in enumerate(TEXTS))
    )
    paths["csv"].write_text(
        "id,body\n" + "".join(f'k{i},"{t}, quoted"\n' for i, t in enumerate(TEXTS))
    )
    table = pa.table({"id": [f"k{i}" for i in range(10)], "body": TEXTS})
    pq.write_table(table, paths["parquet"], row_group_size=3)
    return paths


def test_every_format_streams_its_texts_in_order_from_any_row(tmp_path: Path) -> None:
    paths = write_inputs(tmp_path)
    assert [r.text for r in Source(paths["txt"]).rows()] == TEXTS
    jsonl = Source(paths["jsonl"], field="body", id_field="id")
    assert jsonl.check() == 10
    assert [(r.text, r.id) for r in jsonl.rows(7)] == [(TEXTS[i], f"k{i}") for i in (7, 8, 9)]
    csv_rows = list(Source(paths["csv"], field="body").rows())
    assert csv_rows[0].text == "text number 0, quoted"
    parquet = Source(paths["parquet"], field="body", id_field="id")
    assert parquet.check() == 10
    assert [r.id for r in parquet.rows(4)] == [f"k{i}" for i in range(4, 10)]


@pytest.mark.parametrize(
    ("fmt", "field", "message"),
    [
        ("jsonl", "missing", "line 1 has no field 'missing'"),
        ("csv", "missing", "no column 'missing' (columns: id, body)"),
        ("parquet", "missing", "no column 'missing' (columns: id, body)"),
    ],
)
def test_a_missing_field_is_named_before_anything_is_sent(
    tmp_path: Path, fmt: str, field: str, message: str
) -> None:
    paths = write_inputs(tmp_path)
    with pytest.raises(SourceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Source(paths[fmt], field=field).check()


def test_bad_rows_and_files_are_named(tmp_path: Path) -> None:
    blank = tmp_path / "blank.txt"
    blank.write_text("one\n\nthree\n")
    with pytest.raises(SourceError, match="line 2 is empty"):
        Source(blank).check()
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(SourceError, match="line 2 is not JSON"):
        Source(broken).check()
    with pytest.raises(SourceError, match="no such file"):
        Source(tmp_path / "nope.txt")
    not_parquet = tmp_path / "fake.parquet"
    not_parquet.write_text("hello")
    with pytest.raises(SourceError, match="not a Parquet file"):
        Source(not_parquet).check()
    with pytest.raises(SourceError, match="cannot tell the format"):
        Source(tmp_path / "in.xlsx")


def test_npy_resumes_from_its_last_checkpoint_and_rewrites_nothing_twice(tmp_path: Path) -> None:
    out = tmp_path / "out.npy"
    vectors = np.arange(40, dtype=np.float32).reshape(10, 4)
    sink = open_sink(out, RUN, 10, resume=False, overwrite=False)
    sink.write(vectors[:4], None)
    sink.checkpoint()
    sink.write(vectors[4:6], None)  # written but never checkpointed: redone on resume
    with pytest.raises(SinkError, match="--resume to continue it"):
        open_sink(out, RUN, 10, resume=False, overwrite=False)
    with pytest.raises(SinkError, match="started with model='m', not 'other'"):
        open_sink(out, {**RUN, "model": "other"}, 10, resume=True, overwrite=False)
    resumed = open_sink(out, RUN, 10, resume=True, overwrite=False)
    assert resumed.rows_done == 4
    resumed.write(vectors[4:], None)
    resumed.finish()
    assert np.array_equal(np.load(out), vectors)
    assert not (tmp_path / "out.npy.progress").exists()
    with pytest.raises(SinkError, match="is complete"):
        open_sink(out, RUN, 10, resume=True, overwrite=False)


def test_parquet_keeps_ids_and_joins_its_parts_on_finish(tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    vectors = np.arange(40, dtype=np.float32).reshape(10, 4)
    ids = [f"k{i}" for i in range(10)]
    sink = open_sink(out, RUN, 10, resume=False, overwrite=False)
    sink.write(vectors[:3], ids[:3])
    sink.checkpoint()
    sink.write(vectors[3:5], ids[3:5])  # lost with the interruption
    resumed = open_sink(out, RUN, 10, resume=True, overwrite=False)
    assert resumed.rows_done == 3
    resumed.write(vectors[3:], ids[3:])
    resumed.finish()
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == ids
    assert np.array_equal(np.array(table.column("embedding").to_pylist()), vectors)
    assert not (tmp_path / "out.parquet.parts").exists()
