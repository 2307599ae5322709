"""A nats-server that takes only authenticated TLS connections, for tests: a self-signed
CA made here, a server certificate for 127.0.0.1/localhost, a client certificate, and a
config file with `authorization` users and a `tls` block."""

from __future__ import annotations

import datetime
import ipaddress
import json
import secrets
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shoal.queue.embedded import EmbeddedNats

__all__ = ["Pki", "SecureNats", "converse", "make_pki", "new_nkey_seed", "start_secure_nats"]


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    """A CA that signed none of these: a client trusting only it must refuse the server."""


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _ca(common: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca: x509.Certificate,
    common: str,
    usage: x509.ObjectIdentifier,
    names: list[x509.GeneralName],
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def make_pki(root: Path) -> Pki:
    """A CA, a server certificate (127.0.0.1, localhost), a client certificate and an
    unrelated CA, as PEM files under `root`."""
    root.mkdir(parents=True, exist_ok=True)
    ca_key, ca = _ca("shoal test CA")
    _, other = _ca("some other CA")
    server_names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    server_key, server = _leaf(ca_key, ca, "nats", ExtendedKeyUsageOID.SERVER_AUTH, server_names)
    client_key, client = _leaf(ca_key, ca, "shoal", ExtendedKeyUsageOID.CLIENT_AUTH, [])
    files = {
        "ca.pem": ca.public_bytes(serialization.Encoding.PEM),
        "other-ca.pem": other.public_bytes(serialization.Encoding.PEM),
        "server.pem": server.public_bytes(serialization.Encoding.PEM),
        "server-key.pem": _key_pem(server_key),
        "client.pem": client.public_bytes(serialization.Encoding.PEM),
        "client-key.pem": _key_pem(client_key),
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    return Pki(
        ca=root / "ca.pem",
        server_cert=root / "server.pem",
        server_key=root / "server-key.pem",
        client_cert=root / "client.pem",
        client_key=root / "client-key.pem",
        other_ca=root / "other-ca.pem",
    )


def new_nkey_seed() -> tuple[str, str]:
    """A fresh user NKey: (seed, public key)."""
    seed = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
    return seed.decode(), nkeys.from_seed(bytearray(seed)).public_key.decode()


@dataclass
class SecureNats:
    server: EmbeddedNats
    pki: Pki
    user: str
    password: str
    nkey_seed_file: Path

    @property
    def url(self) -> str:
        return self.server.url


def start_secure_nats(root: Path, verify_clients: bool = True) -> SecureNats:
    """A nats-server with JetStream that takes only TLS (started first by the client, or
    after its INFO: `handshake_first: auto`), with a client certificate when
    `verify_clients`, and only the user `shoal` (password) or an NKey user."""
    pki = make_pki(root / "pki")
    password = secrets.token_urlsafe(24)
    seed, public = new_nkey_seed()
    seed_file = root / "user.nk"
    seed_file.write_text(seed + "\n")
    seed_file.chmod(0o600)
    tls: dict[str, Any] = {
        "cert_file": str(pki.server_cert),
        "key_file": str(pki.server_key),
        "ca_file": str(pki.ca),
        "verify": verify_clients,
        "handshake_first": "auto",
        "timeout": 2,
    }
    config = {
        "authorization": {"users": [{"user": "shoal", "password": password}, {"nkey": public}]},
        "tls": tls,
    }
    conf = root / "secure.conf"
    conf.write_text(json.dumps(config, indent=2))
    conf.chmod(0o600)
    server = EmbeddedNats(root / "nats", extra_args=["--config", str(conf)])
    server.start(log_file=root / "nats-server.log")
    return SecureNats(server, pki, "shoal", password, seed_file)


def converse(
    port: int, context: ssl.SSLContext | None, password: str, server_name: str = "127.0.0.1"
) -> bytes:
    """CONNECT with the right password and PING, over TLS (started first) or in the
    clear; everything the server sent until it closed or went quiet."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock = context.wrap_socket(raw, server_hostname=server_name) if context else raw
    connect = {"user": "shoal", "pass": password, "verbose": False, "pedantic": False}
    received = b""
    with sock:
        try:
            received += sock.recv(65536)  # INFO
            sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
            while b"PONG" not in received:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
        except OSError:
            pass  # reset or silent: refused either way
    return received
