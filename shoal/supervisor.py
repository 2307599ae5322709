"""`shoal serve`: the whole system on one machine, as child processes.

Starts a local nats-server (JetStream, loopback, data in the data dir), one encoder
worker, one generation worker and the gateway, each in its own session so that Ctrl-C
reaches only this supervisor, which then stops them in order: gateway (no new requests),
workers (they finish or return what they hold), nats-server. Children are tied to the
supervisor's life with PR_SET_PDEATHSIG, so even a killed supervisor leaves no orphans.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from .config import Settings
from .queue.embedded import EmbeddedNats

__all__ = ["serve"]

log = logging.getLogger("shoal.serve")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Not on Linux: no such call, and the ordered shutdown in `serve` still applies.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _Child:
    def __init__(self, name: str, args: list[str], log_path: Path | None) -> None:
        self.name = name
        out = open(log_path, "ab") if log_path else None  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shoal", *args],
            start_new_session=True,
            preexec_fn=_die_with_parent,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float) -> None:
        if not self.alive():
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in %.0fs; killing it", self.name, timeout)
            self.process.kill()
            self.process.wait()


def serve(settings: Settings) -> int:
    """Run until SIGINT/SIGTERM or until a child dies; returns the exit status."""
    data_dir = Path(settings.data_dir)
    run_dir = data_dir / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    stopping = False

    def _stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)

    nats = EmbeddedNats(data_dir / "nats").start(
        log_file=run_dir / "nats-server.log", preexec_fn=_die_with_parent
    )
    settings.nats.url = nats.url
    config = run_dir / "settings.json"
    config.write_bytes(msgspec.json.encode(settings))
    children: list[_Child] = []
    status = 0
    try:
        children.append(_Child("worker", ["worker", "--config", str(config)], None))
        if settings.serve_generation:
            children.append(
                _Child("generator", ["worker", "--kind", "generate", "--config", str(config)], None)
            )
        children.append(_Child("gateway", ["gateway", "--config", str(config)], None))
        g = settings.gateway
        log.info(
            "shoal: gateway on http://%s:%d (NATS %s, data in %s); Ctrl-C stops",
            g.host,
            g.port,
            nats.url,
            data_dir,
        )
        while not stopping:
            dead = [c for c in children if not c.alive()]
            if dead:
                log.error("%s exited with %s; stopping", dead[0].name, dead[0].process.returncode)
                status = 1
                break
            time.sleep(0.2)
    finally:
        for child in reversed(children):  # gateway first, then the worker
            child.stop(timeout=30.0)
        nats.stop()
        log.info("shoal: stopped")
    return status
