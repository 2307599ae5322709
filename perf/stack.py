"""Shoal as real processes for a benchmark: nats-server, one encoder worker, the gateway."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.queue.embedded import EmbeddedNats
from tests.helpers import MODEL, start_gateway, start_worker, wait_ready


@dataclass
class Stack:
    base: str
    """The gateway's URL."""
    pids: dict[str, int]
    """Process ids by role (`gateway`, `worker`), for a profiler."""


@contextlib.contextmanager
def local_stack(profile: Mapping[str, Any] | None = None) -> Iterator[Stack]:
    """Start everything on loopback in a temporary data dir; yield where it listens.
    `profile` overrides fields of MiniLM's built-in batching profile (through a user
    model spec over the built-in one), e.g. `{"dtype": "bfloat16"}`."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        env = {}
        if profile:
            env["SHOAL_MODELS_FILE"] = str(_profiled_spec(tmp_path, profile))
        nats = EmbeddedNats(tmp_path / "nats").start()
        worker = start_worker(nats.url, tmp_path, extra=env)
        gateway, base = start_gateway(nats.url, tmp_path, extra=env)
        try:
            wait_ready(base, worker)
            yield Stack(base, {"gateway": gateway.pid, "worker": worker.pid})
        finally:
            gateway.stop()
            worker.stop()
            nats.stop()


def _profiled_spec(directory: Path, profile: Mapping[str, Any]) -> Path:
    """The built-in MiniLM spec with `profile` over its own, as a user spec file."""
    import json

    import msgspec

    from shoal.model_registry.registry import BUILTIN_SPEC
    from shoal.model_registry.spec import load_catalog

    [spec] = [m for m in load_catalog(BUILTIN_SPEC).models if m.id == MODEL]
    fields = msgspec.to_builtins(spec)
    fields["profile"].update(profile)
    # JSON scalars and arrays of them are valid TOML values; tables get their own header.
    lines = ["[[models]]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in fields.items() if not isinstance(v, dict)]
    for name, table in fields.items():
        if isinstance(table, dict):
            lines += [f"[models.{name}]", *(f"{k} = {json.dumps(v)}" for k, v in table.items())]
    path = directory / "models.toml"
    path.write_text("\n".join(lines) + "\n")
    return path
