"""Shoal as real processes for a benchmark: nats-server, one encoder worker, the gateway."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from shoal.queue.embedded import EmbeddedNats
from tests.helpers import start_gateway, start_worker, wait_ready


@contextlib.contextmanager
def local_stack() -> Iterator[str]:
    """Start everything on loopback in a temporary data dir; yield the gateway's URL."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        nats = EmbeddedNats(tmp_path / "nats").start()
        worker = start_worker(nats.url, tmp_path)
        gateway, base = start_gateway(nats.url, tmp_path)
        try:
            wait_ready(base, worker)
            yield base
        finally:
            gateway.stop()
            worker.stop()
            nats.stop()
