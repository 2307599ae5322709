"""The chart's NATS security, run for real: the NATS config, Secrets and environment the
chart renders are given to a real nats-server, and a Shoal connection is built from the
environment the chart gives Shoal's pods. Kubernetes' part is played here, as written
in its docs: Secret keys become files under a volume's mount path (only the listed
`items` when there are some), `secretKeyRef` variables take the key's value, `$(NAME)`
expands variables listed before.

The bundled chart runs three NATS nodes whose routes name each other by DNS; here one node
runs (its routes find no peers, which leaves client connections as they are).

Last, an upgrade: Helm renders against a stand-in for the API server's Secrets, so
`lookup` finds what the install made.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nats
import nats.errors
import pytest

from shoal.config import load_settings
from shoal.queue.embedded import free_port, nats_server_binary
from shoal.queue.nats import Bus
from tests.deploy.test_helm_chart import by_kind, nats_conf, render
from tests.nats_secure import converse

NATS_HOST = "shoal-nats.ml.svc.cluster.local"


def _secret_data(docs: list[dict]) -> dict[str, dict[str, bytes]]:
    return {
        name: {k: base64.b64decode(v) for k, v in s["data"].items()}
        for name, s in by_kind(docs, "Secret").items()
    }


def _mount(pod: dict, container: dict, secrets: dict, root: Path) -> dict[str, Path]:
    """Writes the container's Secret volumes under `root` as the kubelet would; its
    mount paths -> where they are here."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    where: dict[str, Path] = {}
    for mount in container["volumeMounts"]:
        volume = volumes.get(mount["name"], {})  # absent: a volume claim template's
        if "secret" not in volume:
            continue
        data = secrets[volume["secret"]["secretName"]]
        items = volume["secret"].get("items") or [{"key": k, "path": k} for k in data]
        local = root / mount["mountPath"].strip("/")
        local.mkdir(parents=True, exist_ok=True)
        for item in items:
            (local / item["path"]).write_bytes(data[item["key"]])
        where[mount["mountPath"]] = local
    return where


def _environment(container: dict, secrets: dict, fields: dict[str, str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            # $(NAME) of a variable listed before; anything else stays as written.
            env[var["name"]] = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: env.get(m[1], m[0]),
                var["value"],
            )
        elif "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]][ref["key"]].decode()
        else:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


@dataclass
class Deployed:
    url: str
    port: int
    shoal_env: dict[str, str]
    password: str


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    root = tmp_path_factory.mktemp("cluster")
    docs = render()
    secrets = _secret_data(docs)
    (sts,) = by_kind(docs, "StatefulSet").values()
    pod = sts["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "nats")
    mounts = _mount(pod, container, secrets, root / "nats-pod")
    port = free_port()
    conf = nats_conf(docs)
    for path, local in mounts.items():
        conf = conf.replace(f'"{path}/', f'"{local}/')
    # Every port on loopback, free ones.
    conf = conf.replace('"port": 4222', f'"host": "127.0.0.1", "port": {port}')
    conf = conf.replace('"port": 6222', f'"host": "127.0.0.1", "port": {free_port()}')
    conf = conf.replace('"http_port": 8222', f'"http": "127.0.0.1:{free_port()}"')
    conf = conf.replace('"/data"', f'"{root}/js"')
    conf = conf.replace('"/var/run/nats/nats.pid"', f'"{root}/nats.pid"')
    (root / "nats.conf").write_text(conf)
    fields = {"metadata.name": "shoal-nats-0"}
    # The server reads its credentials from its environment, as in its pod.
    log = open(root / "nats-server.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [str(nats_server_binary()), "--config", str(root / "nats.conf")],
        env={**_environment(container, secrets, fields), "PATH": os.defpath},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"nats://127.0.0.1:{port}"

    gateway = by_kind(docs, "Deployment")["shoal-gateway"]["spec"]["template"]["spec"]
    (shoal,) = gateway["containers"]
    shoal_mounts = _mount(gateway, shoal, secrets, root / "gateway-pod")
    env = _environment(shoal, secrets, {})
    env = {k: v for k, v in env.items() if k.startswith("SHOAL_NATS__")}
    for path, local in shoal_mounts.items():
        env = {k: v.replace(path, str(local)) for k, v in env.items()}
    assert env["SHOAL_NATS__URL"] == f"nats://{NATS_HOST}:4222"
    # In the pod that name reaches the Service; here 127.0.0.1 does, with the same name
    # checked in the certificate.
    env["SHOAL_NATS__URL"] = url
    env["SHOAL_NATS__TLS_SERVER_NAME"] = NATS_HOST
    try:
        _wait_listening(server, port, root / "nats-server.log")
        yield Deployed(url, port, env, secrets["shoal-nats-client-auth"]["password"].decode())
    finally:
        server.terminate()
        server.wait(10)
        log.close()


def _wait_listening(server: subprocess.Popen, port: int, log: Path) -> None:
    for _ in range(300):
        if server.poll() is not None:
            raise RuntimeError(f"nats-server exited:\n{log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(log.read_text()[-3000:])


async def test_a_shoal_pod_connects_to_the_charts_nats(deployed: Deployed) -> None:
    settings = load_settings(env=deployed.shoal_env).nats
    assert settings.uses_tls and settings.user == "shoal"
    bus = await Bus.connect(settings, "chart-test")
    try:
        got: asyncio.Queue[bytes] = asyncio.Queue()
        await bus.subscribe("chart.test", got.put_nowait)
        await bus.publish("chart.test", b"hello")
        assert await asyncio.wait_for(got.get(), 10) == b"hello"
    finally:
        await bus.close()


async def test_the_charts_nats_refuses_a_client_without_the_password(deployed: Deployed) -> None:
    settings = load_settings(env=deployed.shoal_env).nats
    context = ssl.create_default_context(cafile=settings.tls_ca_file)
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            deployed.url,
            tls=context,
            tls_hostname=NATS_HOST,
            allow_reconnect=False,
            connect_timeout=5,
        )


def test_the_charts_nats_refuses_plain_text(deployed: Deployed) -> None:
    settings = load_settings(env=deployed.shoal_env).nats
    context = ssl.create_default_context(cafile=settings.tls_ca_file)
    port = deployed.port
    assert b"PONG" in converse(port, context, deployed.password, server_name=NATS_HOST)
    assert b"PONG" not in converse(port, None, deployed.password)


class SecretsApi:
    """The part of a Kubernetes API server that Helm's `lookup` reads: GET of a Secret in
    a namespace (404 for any other); what Helm asked is kept."""

    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], dict] = {}
        self.asked: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                api.asked.append(path)
                found = re.fullmatch(r"/api/v1/namespaces/([^/]+)/secrets/([^/]+)", path)
                if path == "/api/v1":
                    resource = {"name": "secrets", "namespaced": True, "kind": "Secret",
                                "verbs": ["get"]}  # fmt: skip
                    body = {"kind": "APIResourceList", "groupVersion": "v1",
                            "resources": [resource]}  # fmt: skip
                elif found and (found[1], found[2]) in api.secrets:
                    body = api.secrets[found[1], found[2]]
                else:
                    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": "NotFound", "code": 404}  # fmt: skip
                data = json.dumps(body).encode()
                self.send_response(404 if body.get("code") == 404 else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def keep(self, docs: list[dict]) -> None:
        for name, secret in by_kind(docs, "Secret").items():
            self.secrets["ml", name] = {**secret, "metadata": {**secret["metadata"],
                                                               "namespace": "ml"}}  # fmt: skip


@pytest.fixture
def secrets_api() -> Iterator[SecretsApi]:
    api = SecretsApi()
    api.thread.start()
    try:
        yield api
    finally:
        api.server.shutdown()
        api.server.server_close()


def test_an_upgrade_keeps_the_password_and_certificates(
    secrets_api: SecretsApi, tmp_path: Path
) -> None:
    """Rendered against a cluster (Helm's `--dry-run=server`, as an upgrade renders), the
    chart reads its Secrets back and keeps them: NATS and Shoal's pods stay in step."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("")  # nothing of the user's own clusters
    cluster = ["--dry-run=server", "--kube-apiserver", secrets_api.url,
               "--kubeconfig", str(kubeconfig)]  # fmt: skip
    installed = render(*cluster)
    assert "/api/v1/namespaces/ml/secrets/shoal-nats-client-auth" in secrets_api.asked
    secrets_api.keep(installed)
    upgraded = render(*cluster)
    for name in ("shoal-nats-client-auth", "shoal-nats-tls"):
        assert (
            by_kind(upgraded, "Secret")[name]["data"] == by_kind(installed, "Secret")[name]["data"]
        )
    # Without the cluster (the control) both are made anew.
    fresh = by_kind(render(), "Secret")
    for name in ("shoal-nats-client-auth", "shoal-nats-tls"):
        assert fresh[name]["data"] != by_kind(installed, "Secret")[name]["data"]
    # A chosen password wins over the kept one.
    chosen = render(*cluster, "--set", "queue.auth.password=chosen")
    password = by_kind(chosen, "Secret")["shoal-nats-client-auth"]["data"]["password"]
    assert base64.b64decode(password) == b"chosen"
