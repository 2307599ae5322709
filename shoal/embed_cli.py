"""`shoal embed INPUT --model M --output OUT`: embed a file of texts through a gateway.

Reads text (a line each), JSONL (`--field`), CSV or Parquet (`--column`), checks every
row first, then streams the rows to the native route with the bulk client (`concurrency`
requests of `batch_size` texts in flight, retrying 429/503) and writes `.npy` or Parquet
in input order with a live progress bar. Ctrl-C stops after the batch being written and
saves what is done; `--resume` goes on from there, and no row is written twice.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from .client import Client, ShoalAPIError
from .client.clients import DEFAULT_URL
from .client.sinks import Sink, SinkError, open_sink
from .client.sources import FORMATS, Source, SourceError
from .config import client_api_key

__all__ = ["add_embed_command", "run_embed_command"]

_CHECKPOINT_SECONDS = 2.0


def add_embed_command(sub: Any) -> None:
    p = sub.add_parser(
        "embed",
        help="embed a text, JSONL, CSV or Parquet file into .npy or Parquet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input", type=Path)
    p.add_argument("--model", required=True)
    p.add_argument("--output", "-o", type=Path, required=True, help="OUT.npy or OUT.parquet")
    p.add_argument(
        "--field",
        "--column",
        dest="field",
        help="the JSONL field or CSV/Parquet column holding the text (default: text)",
    )
    p.add_argument("--id", dest="id_field", help="a field or column to keep as Parquet's `id`")
    p.add_argument("--format", choices=FORMATS, help="the input's format (default: by suffix)")
    p.add_argument("--url", default=DEFAULT_URL, help="gateway base URL")
    p.add_argument(
        "--api-key",
        default=client_api_key() or None,
        help="sent as a Bearer token (default: $SHOAL_API_KEY)",
    )
    p.add_argument("--batch-size", type=int, default=256, help="texts per request")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    p.add_argument("--dimensions", type=int, help="truncate vectors to this many dimensions")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run_embed_command(args: argparse.Namespace) -> int:
    try:
        if args.id_field and args.output.suffix.lower() == ".npy":
            raise SinkError("--id needs a Parquet output (.npy holds only the vectors)")
        source = Source(args.input, args.field, args.id_field, args.format)
        total = source.check()
        run = {
            "input": str(args.input.resolve()),
            "model": args.model,
            "dtype": args.dtype,
            "dimensions": args.dimensions,
            "field": args.field,
            "id": args.id_field,
            "total": total,
        }
        sink = open_sink(args.output, run, total, args.resume, args.overwrite)
    except (SourceError, SinkError) as exc:
        return _fail(str(exc), 2)
    start = sink.rows_done
    if start:
        _say(args, f"resuming at row {start} of {total}")
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, _stop_at_next_batch(interrupted))
    try:
        with Client(args.url, api_key=args.api_key) as client, _progress(args, total, start) as bar:
            _embed_rows(client, args, source, sink, start, bar, interrupted)
    except (ShoalAPIError, httpx.HTTPError) as exc:
        sink.checkpoint()
        return _fail(f"{exc} ({sink.rows_done} of {total} rows saved; --resume continues)", 1)
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted.is_set():
        sink.checkpoint()
        return _fail(
            f"interrupted; {sink.rows_done} of {total} rows saved, "
            "run again with --resume to finish",
            130,
        )
    sink.finish()
    _say(args, f"{total} rows -> {args.output}")
    return 0


def _stop_at_next_batch(interrupted: threading.Event):
    """Ctrl-C once: stop after the batch being written (nothing is torn); twice: now."""

    def handler(signum: int, frame: object) -> None:
        if interrupted.is_set():
            raise KeyboardInterrupt
        interrupted.set()

    return handler


def _embed_rows(
    client: Client,
    args: argparse.Namespace,
    source: Source,
    sink: Sink,
    start: int,
    advance,
    interrupted: threading.Event,
) -> None:
    rows = source.rows(start)
    ids: Iterator[str | None] | None = None
    if args.id_field:
        ids = (row.id for row in source.rows(start))  # a second reader, in lockstep
    vectors = client.embed_iter(
        (row.text for row in rows),
        model=args.model,
        batch_size=args.batch_size,
        concurrency=args.concurrency,
        dtype=args.dtype,
        dimensions=args.dimensions,
    )
    saved_at = time.monotonic()
    # Closing the iterator waits for the requests in flight and drops their answers.
    with contextlib.closing(vectors):
        for batch in vectors:
            batch_ids = None if ids is None else list(itertools.islice(ids, len(batch)))
            sink.write(batch, batch_ids)  # type: ignore[arg-type]
            advance(len(batch), client.prompt_tokens)
            if interrupted.is_set():
                return
            if time.monotonic() - saved_at > _CHECKPOINT_SECONDS:
                sink.checkpoint()
                saved_at = time.monotonic()


class _progress:
    """A rich progress bar (rows, rows/s, tokens/s, ETA), or nothing with --quiet."""

    def __init__(self, args: argparse.Namespace, total: int, start: int) -> None:
        self.quiet = args.quiet
        self.total = total
        self.start = start
        self.started = time.monotonic()

    def __enter__(self):
        if self.quiet:
            return lambda rows, tokens: None
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("embedding"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} rows/s, {task.fields[tokens]} tokens/s"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self.bar.start()
        task = self.bar.add_task("embed", total=self.total, completed=self.start, rate=0, tokens=0)

        def advance(rows: int, tokens: int) -> None:
            elapsed = max(1e-6, time.monotonic() - self.started)
            done = self.bar.tasks[0].completed + rows - self.start
            self.bar.update(
                task,
                advance=rows,
                rate=f"{done / elapsed:,.0f}",
                tokens=f"{tokens / elapsed:,.0f}",
            )

        return advance

    def __exit__(self, *exc: object) -> None:
        if not self.quiet:
            self.bar.stop()


def _say(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(f"shoal embed: {message}", file=sys.stderr)


def _fail(message: str, code: int) -> int:
    print(f"shoal embed: {message}", file=sys.stderr)
    return code
