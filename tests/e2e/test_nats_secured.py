"""Shoal on a NATS that takes only authenticated TLS connections (issue #37, finding 1).

A real nats-server with `authorization` users and a `tls` block that verifies client
certificates (tests/nats_secure.py makes the CA and certificates); a gateway that logs in
with a password and an encoder worker that logs in with an NKey, each configured only
through `SHOAL_NATS__*` variables; the official openai SDK through them. The same server
refuses a client without credentials and a client that does not speak TLS, so the
stack's answer shows that Shoal really authenticated and encrypted.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import nats
import nats.errors
import openai
import pytest

from shoal.config import NatsSettings
from shoal.queue.errors import QueueUnavailableError
from shoal.queue.nats import Bus
from tests.helpers import MODEL, ShoalProcess, start_gateway, start_worker, wait_ready
from tests.nats_secure import SecureNats, converse, start_secure_nats

pytestmark = pytest.mark.slow


@dataclass
class Stack:
    nats: SecureNats
    base: str
    processes: list[ShoalProcess]


def _tls_env(nats: SecureNats) -> dict[str, str]:
    pki = nats.pki
    return {
        "SHOAL_NATS__TLS_CA_FILE": str(pki.ca),
        "SHOAL_NATS__TLS_CERT_FILE": str(pki.client_cert),
        "SHOAL_NATS__TLS_KEY_FILE": str(pki.client_key),
        # Fail in seconds, not the default 90, when the credentials are not taken.
        "SHOAL_NATS__READY_WITHIN": "20",
    }


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("secured")
    server = start_secure_nats(root)
    processes: list[ShoalProcess] = []
    try:
        worker_env = {**_tls_env(server), "SHOAL_NATS__NKEY_SEED_FILE": str(server.nkey_seed_file)}
        processes.append(start_worker(server.url, root, extra=worker_env))
        gateway_env = {
            **_tls_env(server),
            "SHOAL_NATS__USER": server.user,
            "SHOAL_NATS__PASSWORD": server.password,
        }
        gateway, base = start_gateway(server.url, root, gateway_env)
        processes.append(gateway)
        wait_ready(base, processes[0])
        yield Stack(server, base, processes)
    finally:
        for process in reversed(processes):
            process.stop()
        server.server.stop()


def test_the_openai_sdk_is_answered_through_authenticated_tls(secured: Stack) -> None:
    client = openai.OpenAI(base_url=f"{secured.base}/v1", api_key="x", max_retries=0)
    response = client.embeddings.create(model=MODEL, input=["hello", "secure world"])
    assert [len(d.embedding) for d in response.data] == [384, 384]
    for process in secured.processes:
        assert secured.nats.password not in process.log()


def test_a_client_without_credentials_is_refused(secured: Stack) -> None:
    """TLS with a valid client certificate, but no user: the server says no."""
    pki = secured.nats.pki
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(str(pki.client_cert), str(pki.client_key))

    async def connect(**credentials: str) -> None:
        nc = await nats.connect(
            secured.nats.url, tls=context, allow_reconnect=False, connect_timeout=5, **credentials
        )
        await nc.close()

    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        asyncio.run(connect())
    asyncio.run(connect(user=secured.nats.user, password=secured.nats.password))  # the control


def test_a_plaintext_client_is_refused(secured: Stack) -> None:
    """The right password in the clear gets no PONG; the same words over TLS do."""
    pki = secured.nats.pki
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    port, password = secured.nats.server.port, secured.nats.password
    assert b"PONG" in converse(port, context, password)  # the probe works...
    assert b"PONG" not in converse(port, None, password)  # ...and plain text is refused


def test_shoal_refuses_a_server_its_ca_did_not_sign(secured: Stack) -> None:
    """Right user, password and client certificate, but the server's certificate does not
    chain to the configured CA: no connection (the password never leaves)."""
    pki = secured.nats.pki
    settings = NatsSettings(
        url=secured.nats.url,
        user=secured.nats.user,
        password=secured.nats.password,
        tls_ca_file=str(pki.other_ca),
        tls_cert_file=str(pki.client_cert),
        tls_key_file=str(pki.client_key),
        connect_timeout=2,
    )
    with pytest.raises(QueueUnavailableError, match="CERTIFICATE_VERIFY_FAILED") as raised:
        asyncio.run(Bus.connect(settings, "test"))
    assert secured.nats.password not in str(raised.value)
    trusted = msgspec.structs.replace(settings, tls_ca_file=str(pki.ca))
    asyncio.run(_connect_and_close(trusted))  # the control: the same with the right CA


async def _connect_and_close(settings: NatsSettings) -> None:
    bus = await Bus.connect(settings, "test")
    await bus.close()
