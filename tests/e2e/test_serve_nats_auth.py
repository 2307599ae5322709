"""`shoal serve`'s own nats-server takes only the user made for this start: another local
user (any process on the machine reaches loopback) cannot read or write the queue. The
password reaches the children through their private settings file, never a command line
or the log."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import nats
import nats.errors
import psutil
import pytest

from shoal.queue.embedded import free_port
from tests.helpers import Watched, stop_with_ctrl_c, wait_until

pytestmark = pytest.mark.slow


async def _connect(url: str, **credentials: str) -> None:
    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=5, **credentials)
    try:
        await nc.jsm().account_info()  # JetStream answers this user
    finally:
        await nc.close()


def _gateway_up(port: int) -> bool:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_serve_nats_refuses_a_client_without_the_generated_password(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env.update(SHOAL_DATA_DIR=str(tmp_path / "data"), SHOAL_SERVE_GENERATION="false")
    log_path = tmp_path / "serve.log"
    log = open(log_path, "wb")  # noqa: SIM115
    serve = subprocess.Popen(
        [sys.executable, "-m", "shoal", "serve", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        watched = Watched(serve, log_path)
        # The gateway answers /health once it is connected to NATS with the password.
        wait_until(lambda: _gateway_up(port), 180, watched, "gateway /health")
        settings = json.loads((tmp_path / "data" / "run" / "settings.json").read_bytes())
        nats_settings = settings["nats"]
        url, user, password = nats_settings["url"], nats_settings["user"], nats_settings["password"]
        assert user and len(password) >= 32

        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            asyncio.run(_connect(url))
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            asyncio.run(_connect(url, user=user, password=password[:-1]))
        asyncio.run(_connect(url, user=user, password=password))  # the control

        children = psutil.Process(serve.pid).children(recursive=True)
        (server,) = [c for c in children if "nats-server" in c.name()]
        assert password not in " ".join(server.cmdline())
        conf = Path(server.cmdline()[server.cmdline().index("--config") + 1])
        assert password in conf.read_text() and stat.S_IMODE(conf.stat().st_mode) == 0o600
        assert stop_with_ctrl_c(serve, children, timeout=60) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        log.close()
    assert password.encode() not in log_path.read_bytes()
