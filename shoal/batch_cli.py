"""`shoal batch submit|status|cancel|list|download`: the Batches API from a terminal.

A plain HTTP client of any Shoal (or OpenAI-compatible) gateway: uploads stream from
disk, `--wait` shows live progress (done/failed/total, rate, ETA) and downloads the
output when the batch ends.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from .config import client_api_key

__all__ = ["add_batch_commands", "run_batch_command"]

_FINAL = {"completed", "failed", "cancelled", "expired"}


class BatchCliError(Exception):
    pass


def add_batch_commands(sub: Any) -> None:
    batch = sub.add_parser("batch", help="submit and follow batch jobs (OpenAI Batches API)")
    _connection(batch, "http://127.0.0.1:8000", client_api_key(openai=True))
    actions = batch.add_subparsers(dest="action", required=True)
    submit = actions.add_parser("submit", help="upload a JSONL file and create a batch")
    submit.add_argument("input", type=Path)
    submit.add_argument("--endpoint", required=True, help="e.g. /v1/chat/completions")
    submit.add_argument("--window", default="24h", help="completion window")
    submit.add_argument("--wait", action="store_true", help="follow progress, then download")
    submit.add_argument("--output", type=Path, help="where --wait writes the output JSONL")
    for name, text in (("status", "show a batch"), ("cancel", "cancel a batch")):
        p = actions.add_parser(name, help=text)
        p.add_argument("batch_id")
    listing = actions.add_parser("list", help="recent batches")
    listing.add_argument("--limit", type=int, default=20)
    download = actions.add_parser("download", help="save a batch's output (and errors)")
    download.add_argument("batch_id")
    download.add_argument("--output", type=Path)
    for action in (submit, listing, download, *(actions.choices[n] for n in ("status", "cancel"))):
        # Before or after the action alike: `shoal batch status ID --url U` works too.
        _connection(action, argparse.SUPPRESS, argparse.SUPPRESS)


def _connection(parser: argparse.ArgumentParser, url: str, api_key: str) -> None:
    parser.add_argument("--url", default=url, help="gateway base URL")
    parser.add_argument(
        "--api-key", default=api_key, help="sent as a Bearer token (default: $SHOAL_API_KEY)"
    )


def run_batch_command(args: argparse.Namespace) -> int:
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with httpx.Client(base_url=args.url.rstrip("/"), headers=headers, timeout=60) as http:
        try:
            return _ACTIONS[args.action](http, args)
        except BatchCliError as exc:
            print(f"shoal batch: {exc}", file=sys.stderr)
            return 1
        except httpx.HTTPError as exc:
            print(f"shoal batch: cannot reach {args.url}: {exc}", file=sys.stderr)
            return 1


def _call(http: httpx.Client, method: str, path: str, **kwargs: Any) -> dict:
    response = http.request(method, path, **kwargs)
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        raise BatchCliError(f"{response.status_code}: {message}")
    return response.json()


def _submit(http: httpx.Client, args: argparse.Namespace) -> int:
    if not args.input.is_file():
        raise BatchCliError(f"no such file: {args.input}")
    with open(args.input, "rb") as handle:
        uploaded = _call(
            http,
            "POST",
            "/v1/files",
            data={"purpose": "batch"},
            files={"file": (args.input.name, handle, "application/jsonl")},
            timeout=None,
        )
    batch = _call(
        http,
        "POST",
        "/v1/batches",
        json={
            "input_file_id": uploaded["id"],
            "endpoint": args.endpoint,
            "completion_window": args.window,
        },
    )
    print(batch["id"])
    if not args.wait:
        return 0
    batch = _follow(http, batch["id"])
    _print_status(batch)
    if batch["status"] in ("completed", "cancelled", "expired"):
        _save_outputs(http, batch, args.output or args.input.with_suffix(".output.jsonl"))
    return 0 if batch["status"] == "completed" else 1


def _follow(http: httpx.Client, batch_id: str) -> dict:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TextColumn("{task.fields[rate]:.1f}/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    started = time.monotonic()
    with Progress(*columns, transient=False) as progress:
        task = progress.add_task("validating", total=None, failed=0, rate=0.0)
        while True:
            batch = _call(http, "GET", f"/v1/batches/{batch_id}")
            counts = batch.get("request_counts") or {}
            done = counts.get("completed", 0) + counts.get("failed", 0)
            progress.update(
                task,
                description=batch["status"],
                total=counts.get("total") or None,
                completed=done,
                failed=counts.get("failed", 0),
                rate=done / max(time.monotonic() - started, 1e-6),
            )
            if batch["status"] in _FINAL:
                return batch
            time.sleep(1.0)


def _print_status(batch: dict) -> None:
    counts = batch.get("request_counts") or {}
    print(
        f"{batch['id']}  {batch['status']}  {batch['endpoint']}  "
        f"{counts.get('completed', 0)} completed, {counts.get('failed', 0)} failed "
        f"of {counts.get('total', 0)}"
    )
    for error in (batch.get("errors") or {}).get("data", [])[:20]:
        print(f"  line {error.get('line')}: {error.get('code')}: {error.get('message')}")


def _save_outputs(http: httpx.Client, batch: dict, output: Path) -> None:
    for key, path in (
        ("output_file_id", output),
        ("error_file_id", output.with_suffix(".errors.jsonl")),
    ):
        file_id = batch.get(key)
        if not file_id:
            continue
        with http.stream("GET", f"/v1/files/{file_id}/content") as response:
            if response.status_code >= 400:
                raise BatchCliError(f"downloading {file_id} failed: {response.status_code}")
            with open(path, "wb") as out:
                for chunk in response.iter_bytes():
                    out.write(chunk)
        print(f"wrote {path}")


def _status(http: httpx.Client, args: argparse.Namespace) -> int:
    _print_status(_call(http, "GET", f"/v1/batches/{args.batch_id}"))
    return 0


def _cancel(http: httpx.Client, args: argparse.Namespace) -> int:
    _print_status(_call(http, "POST", f"/v1/batches/{args.batch_id}/cancel"))
    return 0


def _list(http: httpx.Client, args: argparse.Namespace) -> int:
    for batch in _call(http, "GET", "/v1/batches", params={"limit": args.limit})["data"]:
        _print_status(batch)
    return 0


def _download(http: httpx.Client, args: argparse.Namespace) -> int:
    batch = _call(http, "GET", f"/v1/batches/{args.batch_id}")
    if batch["status"] not in _FINAL:
        raise BatchCliError(f"batch {args.batch_id} is still {batch['status']}")
    _save_outputs(http, batch, args.output or Path(f"{args.batch_id}.output.jsonl"))
    return 0


_ACTIONS = {
    "submit": _submit,
    "status": _status,
    "cancel": _cancel,
    "list": _list,
    "download": _download,
}
