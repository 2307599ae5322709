"""Where `shoal embed` writes vectors, resumably: a `.npy` file or a Parquet file.

Rows arrive in input order. A sink knows how many of them are durable (`rows_done`), so
an interrupted run continues from there with `--resume` and no row is written twice:

- `.npy`: a memory-mapped array of the final shape, written in place; a small progress
  file beside it (`OUT.progress`) records the rows flushed so far and what produced them.
- Parquet (`row` or `id`, and `embedding` as a fixed-size list): rows are saved in parts
  (`OUT.parts/`, each written whole, then renamed); finishing joins the parts into OUT,
  one row group each, and removes them. Memory holds at most one part.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Protocol

import numpy as np

__all__ = ["Sink", "SinkError", "open_sink"]

PART_ROWS = 16384


class SinkError(Exception):
    """The output cannot be written as asked (exists, or resumes a different run)."""


class Sink(Protocol):
    rows_done: int
    """Rows durable on disk: a resumed run starts at this row."""

    def write(self, vectors: np.ndarray, ids: list[str] | None) -> None: ...

    def checkpoint(self) -> None:
        """Make every row written so far durable."""
        ...

    def finish(self) -> None: ...


def open_sink(path: Path, run: dict[str, Any], total: int, resume: bool, overwrite: bool) -> Sink:
    """The sink for `path` (by its suffix). `run` describes the run (model, input, dtype,
    ...): a resumed run must match it."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return NpySink(path, run, total, resume, overwrite)
    if suffix in (".parquet", ".pq"):
        return ParquetSink(path, run, total, resume, overwrite)
    raise SinkError(f"{path}: the output must end in .npy or .parquet")


def _progress_path(path: Path) -> Path:
    return path.with_name(path.name + ".progress")


def _write_json(path: Path, value: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def _resume_from(path: Path, run: dict[str, Any], resume: bool, overwrite: bool) -> int | None:
    """Rows done by the run being resumed, or None for a fresh run (after the checks)."""
    progress = _progress_path(path)
    if resume:
        if not progress.exists():
            if path.exists():
                raise SinkError(f"{path} is complete: nothing to resume")
            return None
        saved = json.loads(progress.read_text())
        for key, value in run.items():
            if saved.get(key) != value:
                raise SinkError(
                    f"{path} was started with {key}={saved.get(key)!r}, not {value!r}; "
                    "resume with the same arguments or start over with --overwrite"
                )
        return int(saved["rows"])
    if (path.exists() or progress.exists()) and not overwrite:
        hint = "--resume to continue it" if progress.exists() else "--overwrite to replace it"
        raise SinkError(f"{path} exists; pass {hint}")
    return None


class NpySink:
    def __init__(
        self, path: Path, run: dict[str, Any], total: int, resume: bool, overwrite: bool
    ) -> None:
        self.path = path
        self.run = run
        self.total = total
        self._array: np.memmap | None = None
        done = _resume_from(path, run, resume, overwrite)
        self.rows_done = done or 0
        self._position = self.rows_done
        if done is not None:
            self._array = np.load(path, mmap_mode="r+")
            if self._array.shape[0] != total:
                raise SinkError(f"{path} holds {self._array.shape[0]} rows, the input {total}")
        else:
            _progress_path(path).unlink(missing_ok=True)

    def write(self, vectors: np.ndarray, ids: list[str] | None) -> None:
        if self._array is None:
            self._array = np.lib.format.open_memmap(
                self.path, mode="w+", dtype=vectors.dtype, shape=(self.total, vectors.shape[1])
            )
        self._array[self._position : self._position + len(vectors)] = vectors
        self._position += len(vectors)

    def checkpoint(self) -> None:
        if self._array is None or self._position == self.rows_done:
            return
        self._array.flush()
        self.rows_done = self._position
        _write_json(_progress_path(self.path), {**self.run, "rows": self.rows_done})

    def finish(self) -> None:
        self.checkpoint()
        self._array = None
        _progress_path(self.path).unlink(missing_ok=True)


class ParquetSink:
    def __init__(
        self, path: Path, run: dict[str, Any], total: int, resume: bool, overwrite: bool
    ) -> None:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise SinkError("Parquet needs pyarrow: pip install 'shoal[bulk]'") from None
        self.path = path
        self.run = run
        self.parts = path.with_name(path.name + ".parts")
        done = _resume_from(path, run, resume, overwrite)
        if done is None:
            shutil.rmtree(self.parts, ignore_errors=True)
            _progress_path(path).unlink(missing_ok=True)
        self.parts.mkdir(parents=True, exist_ok=True)
        # What the parts hold is the truth: a part renamed in just before a crash, after
        # the progress file was last written, counts.
        self.rows_done = sum(self._part_rows(p) for p in self._part_files())
        self._vectors: list[np.ndarray] = []
        self._ids: list[str] = []
        self._buffered = 0

    def _part_files(self) -> list[Path]:
        return sorted(self.parts.glob("part-*.parquet"))

    @staticmethod
    def _part_rows(part: Path) -> int:
        import pyarrow.parquet as pq

        return pq.ParquetFile(part).metadata.num_rows

    def write(self, vectors: np.ndarray, ids: list[str] | None) -> None:
        self._vectors.append(vectors)
        if ids is not None:
            self._ids.extend(ids)
        self._buffered += len(vectors)
        if self._buffered >= PART_ROWS:
            self.checkpoint()

    def checkpoint(self) -> None:
        if not self._buffered:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        matrix = np.concatenate(self._vectors)
        flat = pa.array(matrix.reshape(-1))
        embedding = pa.FixedSizeListArray.from_arrays(flat, matrix.shape[1])
        first = self.rows_done
        if self._ids:
            key = ("id", pa.array(self._ids, type=pa.string()))
        else:
            key = ("row", pa.array(np.arange(first, first + len(matrix), dtype=np.int64)))
        table = pa.table({key[0]: key[1], "embedding": embedding})
        part = self.parts / f"part-{len(self._part_files()):06d}.parquet"
        tmp = part.with_name(part.name + ".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, part)
        self.rows_done += len(matrix)
        self._vectors, self._ids, self._buffered = [], [], 0
        _write_json(_progress_path(self.path), {**self.run, "rows": self.rows_done})

    def finish(self) -> None:
        import pyarrow.parquet as pq

        self.checkpoint()
        parts = self._part_files()
        tmp = self.path.with_name(self.path.name + ".tmp")
        writer = None
        try:
            for part in parts:
                table = pq.read_table(part)
                if writer is None:
                    writer = pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table)
        finally:
            if writer is not None:
                writer.close()
        os.replace(tmp, self.path)
        shutil.rmtree(self.parts, ignore_errors=True)
        _progress_path(self.path).unlink(missing_ok=True)
