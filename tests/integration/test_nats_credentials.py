"""Shoal's NATS connection and its credentials: what a real nats-server with users and
TLS takes and refuses, and what a listener posing as NATS gets to see."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from shoal.config import NatsSettings
from shoal.queue.embedded import free_port
from shoal.queue.errors import QueueUnavailableError
from shoal.queue.nats import Bus, wait_jetstream
from tests.nats_secure import SecureNats, make_pki, start_secure_nats


@pytest.fixture(scope="module")
def secure_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureNats]:
    server = start_secure_nats(tmp_path_factory.mktemp("nats"), verify_clients=False)
    try:
        yield server
    finally:
        server.server.stop()


def _settings(server: SecureNats, **fields: object) -> NatsSettings:
    base = NatsSettings(url=server.url, tls_ca_file=str(server.pki.ca), connect_timeout=2)
    return msgspec.structs.replace(base, **fields)


async def test_a_password_or_an_nkey_opens_jetstream(secure_nats: SecureNats) -> None:
    for settings in (
        _settings(secure_nats, user=secure_nats.user, password=secure_nats.password),
        _settings(secure_nats, nkey_seed_file=str(secure_nats.nkey_seed_file)),
        # A server that sends INFO first (no `handshake_first` on its side) is reached too.
        _settings(
            secure_nats,
            user=secure_nats.user,
            password=secure_nats.password,
            tls_handshake_first=False,
        ),
    ):
        await wait_jetstream(settings, within=10)
        bus = await Bus.connect(settings, "test")
        try:
            await bus.key_value("CREDENTIALS_TEST")
        finally:
            await bus.close()


async def test_a_wrong_password_is_refused_and_not_echoed(secure_nats: SecureNats) -> None:
    wrong = "not-the-password-" + secure_nats.password[:4]
    settings = _settings(secure_nats, user=secure_nats.user, password=wrong)
    with pytest.raises(QueueUnavailableError, match="Authorization Violation") as raised:
        await Bus.connect(settings, "test")
    assert wrong not in str(raised.value) and wrong not in repr(settings)
    with pytest.raises(TimeoutError) as timed_out:
        await wait_jetstream(settings, within=1)
    assert wrong not in str(timed_out.value)


class PosingAsNats:
    """A listener that answers like a NATS server without TLS (as a man in the middle
    would, stripping `tls_required` from the real server's INFO) and keeps every byte a
    client sends it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.received = bytearray()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> PosingAsNats:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        info = {"server_id": "posing", "version": "2.10.0", "auth_required": True, "proto": 1}
        writer.write(b"INFO " + json.dumps(info).encode() + b"\r\n")
        await writer.drain()
        try:
            while chunk := await reader.read(65536):
                self.received += chunk
        except ConnectionError:
            pass
        finally:
            writer.close()


async def test_credentials_never_go_to_a_server_that_skips_tls(tmp_path: Path) -> None:
    """With TLS configured, Shoal starts TLS before the server says anything, so a server
    (or a man in the middle) that offers plain text gets a TLS handshake, never the
    password. nats-py's usual way (TLS after INFO, only if INFO asks) would send it."""
    pki = make_pki(tmp_path / "pki")
    password = "the-password-that-must-stay-secret"
    async with PosingAsNats() as posing:
        settings = NatsSettings(
            url=f"nats://127.0.0.1:{posing.port}",
            user="shoal",
            password=password,
            tls_ca_file=str(pki.ca),
            connect_timeout=1,
        )
        with pytest.raises(QueueUnavailableError):
            await Bus.connect(settings, "test")
        assert posing.received  # it was asked (a TLS client hello)...
        assert password.encode() not in posing.received  # ...and got no password

    async with PosingAsNats() as posing:  # the control: TLS only if the server asks
        downgradable = msgspec.structs.replace(settings, url=f"nats://127.0.0.1:{posing.port}")
        downgradable = msgspec.structs.replace(downgradable, tls_handshake_first=False)
        with pytest.raises(QueueUnavailableError):
            await Bus.connect(downgradable, "test")
        assert password.encode() in posing.received
