"""How `NatsSettings` become nats-py's connect options (the one place every process
connects through)."""

from __future__ import annotations

import ssl
from pathlib import Path

import msgspec
import pytest

from shoal.config import NatsSettings
from shoal.queue.nats.connect import connect_options, servers
from tests.nats_secure import make_pki


def test_no_credentials_no_tls_by_default() -> None:
    assert connect_options(NatsSettings()) == {}
    assert servers(NatsSettings(url=" nats://a:1 , nats://b:2,")) == ["nats://a:1", "nats://b:2"]


def test_each_kind_of_credentials(tmp_path: Path) -> None:
    creds, seed = tmp_path / "u.creds", tmp_path / "u.nk"
    creds.write_text("creds")
    seed.write_text("SU...")
    assert connect_options(NatsSettings(user="u", password="p")) == {"user": "u", "password": "p"}
    assert connect_options(NatsSettings(token="t")) == {"token": "t"}
    assert connect_options(NatsSettings(creds_file=str(creds))) == {"user_credentials": str(creds)}
    assert connect_options(NatsSettings(nkey_seed_file=str(seed))) == {"nkeys_seed": str(seed)}


def test_tls_with_a_ca_a_client_certificate_and_a_server_name(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    settings = NatsSettings(
        tls_ca_file=str(pki.ca),
        tls_cert_file=str(pki.client_cert),
        tls_key_file=str(pki.client_key),
        tls_server_name="nats.internal",
    )
    options = connect_options(settings)
    context = options["tls"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "shoal test CA"),),)]
    assert options["tls_hostname"] == "nats.internal"
    assert options["tls_handshake_first"] is True
    later = connect_options(msgspec.structs.replace(settings, tls_handshake_first=False))
    assert later["tls_handshake_first"] is False


def test_a_tls_url_uses_the_system_cas() -> None:
    options = connect_options(NatsSettings(url="tls://nats.example:4222"))
    assert options["tls"].verify_mode == ssl.CERT_REQUIRED
    assert options["tls_handshake_first"] is True and "tls_hostname" not in options


@pytest.mark.parametrize(
    "field", ["creds_file", "nkey_seed_file", "tls_ca_file", "tls_cert_file", "tls_key_file"]
)
def test_a_missing_file_is_named_at_once(field: str, tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    fields: dict[str, str] = {field: str(tmp_path / "missing.pem")}
    if field == "tls_cert_file":
        fields["tls_key_file"] = str(pki.client_key)
    if field == "tls_key_file":
        fields["tls_cert_file"] = str(pki.client_cert)
    with pytest.raises(ValueError, match=f"{field} .*missing.pem is missing"):
        connect_options(NatsSettings(**fields))


def test_a_certificate_that_does_not_load_is_a_clear_error(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    settings = NatsSettings(tls_cert_file=str(pki.client_cert), tls_key_file=str(pki.server_key))
    with pytest.raises(ValueError, match="TLS files do not load"):
        connect_options(settings)
