"""How every Shoal process connects to NATS: the servers, the credentials and TLS of its
`NatsSettings`, as nats-py's `connect` takes them. `Bus.connect` and `wait_jetstream` (here)
are the only callers, so the gateway, both workers, `shoal tune` and `shoal serve` connect
the same way.

Credentials never appear in what this module raises (nor in `NatsSettings.display_url`).
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any

import nats
import nats.errors

from ...config import NatsSettings
from ...lifecycle import retry_until_ready

__all__ = ["connect_options", "servers", "wait_jetstream"]


def servers(settings: NatsSettings) -> list[str]:
    """The settings' server URLs, one per comma-separated entry."""
    return [s.strip() for s in settings.url.split(",") if s.strip()]


def connect_options(settings: NatsSettings) -> dict[str, Any]:
    """Keyword arguments for `nats.connect`: credentials and TLS (none when unset).

    Raises:
        ValueError: a named file is missing or unreadable, or the TLS files do not load
            (the message names the setting and the file, never a secret).
    """
    options: dict[str, Any] = {}
    if settings.user:
        options["user"], options["password"] = settings.user, settings.password
    if settings.token:
        options["token"] = settings.token
    if settings.creds_file:
        options["user_credentials"] = _readable("creds_file", settings.creds_file)
    if settings.nkey_seed_file:
        options["nkeys_seed"] = _readable("nkey_seed_file", settings.nkey_seed_file)
    if settings.uses_tls:
        options["tls"] = _tls_context(settings)
        # Without this nats-py reads the server's INFO in the clear and starts TLS only if
        # it asks for it: whoever answers in its place gets the credentials.
        options["tls_handshake_first"] = settings.tls_handshake_first
        if settings.tls_server_name:
            options["tls_hostname"] = settings.tls_server_name
    return options


def _tls_context(settings: NatsSettings) -> ssl.SSLContext:
    ca = _readable("tls_ca_file", settings.tls_ca_file) if settings.tls_ca_file else None
    try:
        context = ssl.create_default_context(cafile=ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if settings.tls_cert_file:
            context.load_cert_chain(
                _readable("tls_cert_file", settings.tls_cert_file),
                _readable("tls_key_file", settings.tls_key_file),
            )
    except ssl.SSLError as exc:
        raise ValueError(f"nats: the TLS files do not load: {exc.reason or exc}") from None
    return context


def _readable(name: str, path: str) -> str:
    if not os.access(path, os.R_OK) or not Path(path).is_file():
        raise ValueError(f"nats: {name} {path} is missing or not readable")
    return path


async def wait_jetstream(settings: NatsSettings, within: float = 30.0) -> None:
    """Until JetStream at `settings.url` (comma-separated servers), reached with the
    settings' credentials and TLS, answers API requests: a new cluster answers only once
    its nodes have elected a meta leader.

    Raises:
        TimeoutError: not within `within` seconds.
        ValueError: the settings name TLS or credential files that do not load.
    """
    options = connect_options(settings)
    where = settings.display_url

    async def answers() -> None:
        nc = await nats.connect(
            servers(settings), connect_timeout=2, allow_reconnect=False, **options
        )
        try:
            await nc.jsm().account_info()
        finally:
            await nc.close()

    try:
        await retry_until_ready(
            answers,
            what=f"JetStream at {where}",
            retry_on=(OSError, nats.errors.Error, TimeoutError),
            within=within,
        )
    except (OSError, nats.errors.Error, TimeoutError) as exc:
        raise TimeoutError(f"JetStream at {where} not ready in {within}s: {exc!r}") from exc
