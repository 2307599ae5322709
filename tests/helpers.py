"""Real Shoal processes for tests: gateways and workers as subprocesses on free ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from shoal.queue.embedded import free_port

MODEL = "all-MiniLM-L6-v2"


def shoal_env(nats_url: str, data_dir: Path, extra: Mapping[str, str] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env.update(
        {
            "SHOAL_NATS__URL": nats_url,
            "SHOAL_DATA_DIR": str(data_dir),
            "SHOAL_LOG_LEVEL": "warning",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    env.update(extra or {})
    return env


class ShoalProcess:
    """`python -m shoal <args>` with its output in a log file; stopped by its own PID."""

    def __init__(self, args: list[str], env: dict, log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shoal", *args],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.alive():
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def start_gateway(
    nats_url: str, data_dir: Path, extra: Mapping[str, str] | None = None
) -> tuple[ShoalProcess, str]:
    port = free_port()
    env = shoal_env(nats_url, data_dir, extra)
    proc = ShoalProcess(["gateway", "--port", str(port)], env, data_dir / f"gateway-{port}.log")
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: _ok(base + "/health"), 60, proc, "gateway /health")
    return proc, base


def start_worker(
    nats_url: str,
    data_dir: Path,
    models: str = MODEL,
    extra: Mapping[str, str] | None = None,
    name: str = "worker",
) -> ShoalProcess:
    env = shoal_env(nats_url, data_dir, extra)
    return ShoalProcess(
        ["worker", "--models", models], env, data_dir / f"{name}-{time.monotonic_ns()}.log"
    )


def wait_ready(base: str, proc: ShoalProcess | None = None, timeout: float = 120.0) -> None:
    wait_until(lambda: _ok(base + "/ready"), timeout, proc, "/ready")


def wait_until(check, timeout: float, proc: ShoalProcess | None, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and not proc.alive():
            raise RuntimeError(f"process exited while waiting for {what}:\n{proc.log()}")
        time.sleep(0.2)
    raise TimeoutError(f"{what} not reached in {timeout}s" + (f":\n{proc.log()}" if proc else ""))


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False
