"""Texts to embed, read from a file as a stream: plain text (a line each), JSONL (a field
of each object), CSV or Parquet (a column).

`check` reads the whole file once before anything is sent, counting rows and stopping at
the first row the server would refuse (missing field, not a string, empty), so a run of
10^7 rows never fails half way on bad input. `texts` then streams them, from any row on
(to resume). Memory stays bounded by one line or one Parquet record batch.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import NamedTuple

__all__ = ["FORMATS", "Source", "SourceError"]

FORMATS = ("txt", "jsonl", "csv", "parquet")


class SourceError(Exception):
    """The input cannot be read as asked; the message names the file and the row."""


class Row(NamedTuple):
    text: str
    id: str | None


class Source:
    def __init__(
        self,
        path: Path,
        field: str | None = None,
        id_field: str | None = None,
        fmt: str | None = None,
    ) -> None:
        self.path = path
        self.format = fmt or _format_of(path)
        if self.format not in FORMATS:
            raise SourceError(
                f"{path}: cannot tell the format from the name; pass --format {'|'.join(FORMATS)}"
            )
        if self.format == "txt" and (field or id_field):
            raise SourceError(f"{path}: a text file has no fields; drop --field and --id")
        self.field = field or "text"
        self.id_field = id_field
        if not path.is_file():
            raise SourceError(f"{path}: no such file")

    def check(self) -> int:
        """Rows in the file; raises SourceError at the first one that cannot be sent."""
        count = sum(1 for _ in self._rows())
        if count == 0:
            raise SourceError(f"{self.path}: no rows")
        return count

    def rows(self, start: int = 0) -> Iterator[Row]:
        """Rows from `start` (0-based), in file order."""
        return islice(self._rows(), start, None)

    def _rows(self) -> Iterator[Row]:
        try:
            if self.format == "txt":
                yield from self._txt()
            elif self.format == "jsonl":
                yield from self._jsonl()
            elif self.format == "csv":
                yield from self._csv()
            else:
                yield from self._parquet()
        except (OSError, UnicodeDecodeError) as exc:
            raise SourceError(f"{self.path}: cannot be read: {exc}") from None

    def _txt(self) -> Iterator[Row]:
        with open(self.path, encoding="utf-8", newline="") as handle:
            for number, line in enumerate(handle, start=1):
                yield Row(self._text(line.rstrip("\r\n"), f"line {number}"), None)

    def _jsonl(self) -> Iterator[Row]:
        with open(self.path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SourceError(f"{self.path}: line {number} is not JSON: {exc}") from None
                if not isinstance(record, dict) or self.field not in record:
                    raise SourceError(f"{self.path}: line {number} has no field '{self.field}'")
                yield self._row(record, f"line {number}")

    def _csv(self) -> Iterator[Row]:
        with open(self.path, encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            columns = reader.fieldnames or []
            for name in (self.field, self.id_field):
                if name is not None and name not in columns:
                    raise _no_column(self.path, name, columns)
            for number, record in enumerate(reader, start=2):
                yield self._row(record, f"line {number}")

    def _parquet(self) -> Iterator[Row]:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise SourceError("Parquet needs pyarrow: pip install 'shoal[bulk]'") from None
        try:
            parquet = pq.ParquetFile(self.path)
        except Exception as exc:  # pyarrow raises its own types for a broken file
            raise SourceError(f"{self.path}: not a Parquet file: {exc}") from None
        columns = parquet.schema_arrow.names
        wanted = [c for c in (self.field, self.id_field) if c is not None]
        for name in wanted:
            if name not in columns:
                raise SourceError(
                    f"{self.path}: no column '{name}' (columns: {', '.join(columns)})"
                )
        row = 0
        for batch in parquet.iter_batches(batch_size=8192, columns=wanted):
            texts = batch.column(self.field).to_pylist()
            ids = batch.column(self.id_field).to_pylist() if self.id_field else None
            for i, text in enumerate(texts):
                row += 1
                where = f"row {row}"
                yield Row(self._text(text, where), None if ids is None else str(ids[i]))

    def _row(self, record: dict, where: str) -> Row:
        text = self._text(record.get(self.field), where)
        if self.id_field is None:
            return Row(text, None)
        if record.get(self.id_field) in (None, ""):
            raise SourceError(f"{self.path}: {where} has no '{self.id_field}'")
        return Row(text, str(record[self.id_field]))

    def _text(self, value: object, where: str) -> str:
        if not isinstance(value, str):
            raise SourceError(f"{self.path}: {where}: '{self.field}' is not a string")
        if not value:
            raise SourceError(f"{self.path}: {where} is empty (the server refuses empty texts)")
        return value


def _no_column(path: Path, name: str, columns: list[str]) -> SourceError:
    return SourceError(f"{path}: no column '{name}' (columns: {', '.join(columns)})")


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower().lstrip(".")
    return {"text": "txt", "ndjson": "jsonl", "pq": "parquet"}.get(suffix, suffix)
