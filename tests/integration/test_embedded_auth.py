"""The embedded nats-servers `shoal serve` and `shoal tune` start: given a `ServerAuth`,
clients log in as that user and a cluster's nodes route only to each other; the password
is in a file only this user reads, never on a command line (every local user reads those)."""

from __future__ import annotations

import json
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest

from shoal.config import NatsSettings
from shoal.queue.embedded import EmbeddedNats, EmbeddedNatsCluster, ServerAuth
from shoal.queue.nats import Bus, wait_jetstream


def _info(port: int) -> dict:
    """The INFO a server sends whoever connects to `port` (client or route port)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        line = b""
        while not line.endswith(b"\r\n"):
            chunk = sock.recv(65536)
            assert chunk, "closed before INFO"
            line += chunk
    assert line.startswith(b"INFO ")
    return json.loads(line[5:])


async def _refused(url: str) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(url, allow_reconnect=False, connect_timeout=5)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedNatsCluster]:
    auth = ServerAuth.generate()
    nodes = EmbeddedNatsCluster(tmp_path / "cluster", size=3, auth=auth).start(log_dir=tmp_path)
    try:
        yield nodes
    finally:
        nodes.stop()


async def test_a_cluster_takes_only_its_user_and_routes_only_each_other(
    cluster: EmbeddedNatsCluster,
) -> None:
    settings = cluster.client_settings(NatsSettings(connect_timeout=2))
    assert settings.url == cluster.url and settings.user == "shoal" and settings.password
    # A meta leader is elected only over routes that authenticated to each other.
    await wait_jetstream(settings, within=60)
    bus = await Bus.connect(settings, "test")
    await bus.close()
    for node in cluster.nodes.values():
        await _refused(node.url)
        route_port = int(node.config["cluster"]["listen"].rsplit(":", 1)[1])
        assert _info(route_port).get("auth_required") is True
        assert _info(node.port).get("auth_required") is True
        assert settings.password not in " ".join(node.command())
        assert stat.S_IMODE(node.config_file.stat().st_mode) == 0o600
        assert settings.password in node.config_file.read_text()


async def test_one_server_takes_only_its_user(tmp_path: Path) -> None:
    auth = ServerAuth.generate()
    assert auth.password not in repr(auth)
    server = EmbeddedNats(tmp_path / "nats", auth=auth).start()
    try:
        await _refused(server.url)
        settings = server.client_settings(NatsSettings(token="meant-elsewhere", tls=True))
        assert not settings.token and not settings.uses_tls  # for some other server
        bus = await Bus.connect(settings, "test")
        await bus.close()
    finally:
        server.stop()


async def test_without_auth_the_server_stays_open(nats_server: EmbeddedNats) -> None:
    """What tests and benchmarks start: open, as before (the control)."""
    nc = await nats.connect(nats_server.url, allow_reconnect=False, connect_timeout=5)
    await nc.close()
    assert not nats_server.config_file.exists()
