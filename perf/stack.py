"""Servers for a benchmark: Shoal as real processes (nats-server, one worker, the gateway),
or a peer server run until the benchmark is done."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from shoal.queue.embedded import EmbeddedNats
from tests.helpers import MODEL, start_gateway, start_worker, wait_ready, wait_until


@dataclass
class Stack:
    base: str
    """The gateway's URL."""
    pids: dict[str, int]
    """Process ids by role (`gateway`, `worker`), for a profiler."""


@contextlib.contextmanager
def local_stack(
    profile: Mapping[str, Any] | None = None,
    *,
    model: str = MODEL,
    kind: str = "encode",
    spec: Path | None = None,
    tree: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[Stack]:
    """Start everything on loopback in a temporary data dir, with one worker of `kind`
    serving `model`; yield where it listens. `spec` is a user model spec (for models
    beyond the built-in ones); `profile` overrides fields of `model`'s batching profile,
    e.g. `{"dtype": "bfloat16"}` (both reach the processes as one user spec file). `tree`:
    run the worker and gateway from another checkout of Shoal (before and after a change,
    in one run); `env`: settings for both processes (`SHOAL_...` variables)."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        env = {"SHOAL_WORKER__PINNED": model, **(env or {})}  # pinned: loaded before ready
        if profile or spec:
            env["SHOAL_MODELS_FILE"] = str(_user_spec(tmp_path, model, profile or {}, spec))
        nats = EmbeddedNats(tmp_path / "nats").start()
        worker = start_worker(nats.url, tmp_path, models=model, extra=env, kind=kind, cwd=tree)
        gateway, base = start_gateway(nats.url, tmp_path, extra=env, cwd=tree)
        try:
            wait_ready(base, worker, timeout=300)
            yield Stack(base, {"gateway": gateway.pid, "worker": worker.pid})
        finally:
            gateway.stop()
            worker.stop()
            nats.stop()


def _user_spec(directory: Path, model: str, profile: Mapping[str, Any], spec: Path | None) -> Path:
    """`spec`'s models (or the built-in `model` alone) with `profile` over `model`'s own,
    as one user spec file."""
    import json

    import msgspec

    from shoal.model_registry import ModelRegistry
    from shoal.model_registry.spec import load_catalog

    models = load_catalog(spec).models if spec else []
    if model not in {m.id for m in models}:
        models.append(ModelRegistry.from_files().resolve(model))
    lines = []
    for entry in models:
        fields = msgspec.to_builtins(entry)
        if entry.id == model:
            fields["profile"].update(profile)
        # JSON scalars and arrays of them are valid TOML values; tables get a header.
        lines += ["[[models]]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in fields.items() if not isinstance(v, dict)]
        for name, table in fields.items():
            if isinstance(table, dict):
                lines += [f"[models.{name}]", *(f"{k} = {json.dumps(v)}" for k, v in table.items())]
    path = directory / "models.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def peer_server(
    command: list[str],
    port: int,
    env: dict,
    timeout: float,
    what: str,
    cwd: Path | None = None,
    health: str = "/health",
) -> Iterator[str]:
    """Run a peer server on loopback `port` until the caller is done; its log (tail) is
    the error when it does not come up healthy within `timeout` seconds."""
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
            cwd=cwd,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: _healthy(base + health), timeout, None, what)
            yield base
        except TimeoutError:
            log.seek(0)
            raise RuntimeError(log.read().decode(errors="replace")[-3000:]) from None
        finally:
            process.terminate()
            process.wait(30)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
