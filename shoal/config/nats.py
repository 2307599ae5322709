"""How every process reaches NATS: where it is, how it logs in, TLS, and how Shoal's
streams, consumers and buckets are shaped."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import msgspec

__all__ = ["NatsSettings"]


class NatsSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where NATS is and how Shoal's streams, consumers and buckets are shaped."""

    url: str = "nats://127.0.0.1:4222"
    """NATS server(s); a comma-separated list for a cluster."""
    user: str = ""
    """User name, with `password` (the server's `authorization` users)."""
    password: str = ""
    """The password of `user`; never logged (`***` in settings' repr)."""
    token: str = ""
    """An authorization token, instead of a user and password."""
    creds_file: str = ""
    """A `.creds` file (user JWT and NKey seed: decentralized auth), instead of the above."""
    nkey_seed_file: str = ""
    """A file holding an NKey seed (`SU...`), instead of the above."""
    tls: bool = False
    """Connect over TLS, checking the server against the system's CAs or `tls_ca_file`;
    also on when a CA or client certificate is set or a URL says `tls://`."""
    tls_ca_file: str = ""
    """PEM CA certificate(s) the server's certificate must chain to."""
    tls_cert_file: str = ""
    """A PEM client certificate, with `tls_key_file`, for servers that verify clients."""
    tls_key_file: str = ""
    """The PEM private key of `tls_cert_file`."""
    tls_server_name: str = ""
    """The name the server's certificate must carry, when it differs from the URL's host."""
    tls_handshake_first: bool = True
    """Start TLS before the server's first message, so a man in the middle cannot make a
    server look as if it took plain connections and read the credentials (the server's
    `tls` block needs `handshake_first: auto` or `true`); false: upgrade after it."""
    stream: str = "SHOAL_WORK"
    """The JetStream work stream (WorkQueue retention)."""
    registry_bucket: str = "SHOAL_REGISTRY"
    """The key-value bucket holding models and adapters registered at run time."""
    files_bucket: str = "SHOAL_FILES"
    """Uploaded files' metadata (their bytes live in the object store)."""
    batches_bucket: str = "SHOAL_BATCHES"
    """Batch jobs: state, progress counts and the lease of the runner working on each."""
    subject_prefix: str = "shoal"
    """First token of every Shoal subject, so several deployments can share a cluster."""
    storage: Literal["file", "memory"] = "file"
    """File storage keeps accepted work across a nats-server restart."""
    replicas: int = 1
    """Stream replicas: 3 on a cluster."""
    max_msgs: int = 100_000
    """Bound on queued work items; past it publishes fail at once (`discard: new`) -> 429."""
    max_bytes: int = 1 << 30
    """Bound on queued work bytes, same policy as `max_msgs`."""
    max_age: float = 3600.0
    """Seconds an item may sit in the stream; longer than any request deadline."""
    ack_wait: float = 30.0
    """Seconds before an unacknowledged delivery is redelivered (workers send progress)."""
    max_deliver: int = 5
    """Deliveries before an item is given up on and kept as a dead letter."""
    dead_stream: str = "SHOAL_DEAD"
    """Items that exhausted `max_deliver` (or could not be read), with the reason."""
    dead_max_age: float = 7 * 86400.0
    """Seconds a dead letter is kept."""
    dead_max_bytes: int = 1 << 30
    """Bound on dead letters' bytes; past it the oldest go first."""
    duplicate_window: float = 120.0
    """Seconds within which a repeated `Nats-Msg-Id` is dropped by the server."""
    connect_timeout: float = 5.0
    """Seconds one connection attempt or one JetStream request may take."""
    ready_within: float = 90.0
    """Seconds a starting process waits for NATS to accept its connection and for
    JetStream to answer provisioning (a cluster still electing leaders); past it the
    process exits with the error. A stop signal ends the wait at once."""
    offload_bytes: int = 1 << 20
    """Work items and replies longer than this (or than the server's `max_payload`, less
    16 KiB) travel through the object store (`objects`), a reference in their place."""

    def __post_init__(self) -> None:
        ways = [bool(self.user or self.password), bool(self.token), bool(self.creds_file)]
        if sum([*ways, bool(self.nkey_seed_file)]) > 1:
            raise ValueError("nats: give one of user/password, token, creds_file, nkey_seed_file")
        if bool(self.user) != bool(self.password):
            raise ValueError("nats: user and password go together")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("nats: tls_cert_file and tls_key_file go together")

    @property
    def uses_tls(self) -> bool:
        """Whether connections are TLS: `tls`, a CA or client certificate, a `tls://` URL."""
        return bool(
            self.tls
            or self.tls_ca_file
            or self.tls_cert_file
            or any(s.strip().startswith("tls://") for s in self.url.split(","))
        )

    @property
    def display_url(self) -> str:
        """`url` fit for logs and errors: credentials in it (`nats://user:pass@`, a token
        as `nats://token@`) become `***`."""
        return ",".join(_without_secret(s.strip()) for s in self.url.split(","))

    def __repr__(self) -> str:
        # Settings end up in logs and tracebacks: never with a password or token in them.
        def shown(name: str) -> str:
            value = self.display_url if name == "url" else getattr(self, name)
            return f"{name}={'***' if name in _SECRET and value else value!r}"

        return f"NatsSettings({', '.join(map(shown, self.__struct_fields__))})"


_SECRET = frozenset({"password", "token"})


def _without_secret(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    userinfo, host = parts.netloc.rsplit("@", 1)
    user = userinfo.split(":", 1)[0] if ":" in userinfo else ""
    masked = f"{user}:***" if user else "***"
    return urlunsplit(parts._replace(netloc=f"{masked}@{host}"))
