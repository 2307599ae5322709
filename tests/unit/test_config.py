import logging
from pathlib import Path

import pytest

from shoal.config import load_settings


def test_defaults_bind_loopback_and_use_the_user_data_dir() -> None:
    settings = load_settings(env={"HOME": "/home/u"})
    assert settings.gateway.host == "127.0.0.1"
    assert settings.gateway.port == 8000
    assert settings.data_dir == "/home/u/.local/share/shoal"


def test_env_overrides_file_which_overrides_defaults(tmp_path: Path) -> None:
    config = tmp_path / "shoal.toml"
    config.write_text('[gateway]\nport = 9000\nrequest_timeout = 7.5\n[worker]\nmodels = ["x"]\n')
    env = {
        "SHOAL_DATA_DIR": "/data",
        "SHOAL_GATEWAY__PORT": "9100",
        "SHOAL_WORKER__MODELS": "a,b",
        "SHOAL_NATS__ACK_WAIT": "3",
        "SHOAL_UNRELATED": "ignored",
    }
    settings = load_settings(config, env)
    assert settings.data_dir == "/data"
    assert settings.gateway.port == 9100
    assert settings.gateway.request_timeout == 7.5
    assert settings.worker.models == ["a", "b"]
    assert settings.nats.ack_wait == 3.0


def test_a_mistyped_setting_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="port"):
        load_settings(env={"SHOAL_GATEWAY__PORT": "eighty"})


def test_model_roots_default_to_the_data_dirs_models_and_take_a_list() -> None:
    settings = load_settings(env={"SHOAL_DATA_DIR": "/data"})
    assert settings.model_roots == []
    assert settings.model_root_paths == [Path("/data/models")]
    settings = load_settings(env={"SHOAL_DATA_DIR": "/data", "SHOAL_MODEL_ROOTS": "/m1,/m2"})
    assert settings.model_root_paths == [Path("/m1"), Path("/m2")]


def test_nats_credentials_and_tls_come_from_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "shoal.toml"
    config.write_text('[nats]\nurl = "nats://n1:4222"\ntls_ca_file = "/etc/ca.pem"\n')
    env = {
        "SHOAL_NATS__USER": "shoal",
        "SHOAL_NATS__PASSWORD": "pw-from-a-secret",
        "SHOAL_NATS__TLS_CERT_FILE": "/etc/tls.crt",
        "SHOAL_NATS__TLS_KEY_FILE": "/etc/tls.key",
        "SHOAL_NATS__TLS_SERVER_NAME": "nats.internal",
        "SHOAL_NATS__TLS_HANDSHAKE_FIRST": "false",
    }
    nats = load_settings(config, env).nats
    assert (nats.user, nats.password) == ("shoal", "pw-from-a-secret")
    assert nats.tls_ca_file == "/etc/ca.pem" and nats.tls_cert_file == "/etc/tls.crt"
    assert nats.tls_server_name == "nats.internal" and nats.tls_handshake_first is False
    assert nats.uses_tls
    for other in ({"SHOAL_NATS__TOKEN": "t"}, {"SHOAL_NATS__CREDS_FILE": "/etc/x.creds"}):
        assert load_settings(env=other).nats.uses_tls is False
    nkey = load_settings(env={"SHOAL_NATS__NKEY_SEED_FILE": "/etc/user.nk"}).nats
    assert nkey.nkey_seed_file == "/etc/user.nk"


def test_tls_is_on_with_a_tls_url_or_the_flag() -> None:
    assert not load_settings(env={}).nats.uses_tls
    assert load_settings(env={"SHOAL_NATS__URL": "nats://a:1,tls://b:2"}).nats.uses_tls
    assert load_settings(env={"SHOAL_NATS__TLS": "true"}).nats.uses_tls


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SHOAL_NATS__USER": "u"}, "user and password go together"),
        ({"SHOAL_NATS__PASSWORD": "p"}, "user and password go together"),
        ({"SHOAL_NATS__TOKEN": "t", "SHOAL_NATS__CREDS_FILE": "c"}, "one of"),
        (
            {"SHOAL_NATS__USER": "u", "SHOAL_NATS__PASSWORD": "p", "SHOAL_NATS__TOKEN": "t"},
            "one of",
        ),
        ({"SHOAL_NATS__TLS_CERT_FILE": "c"}, "tls_cert_file and tls_key_file"),
    ],
)
def test_contradicting_nats_credentials_are_a_clear_error(env: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_settings(env=env)


def test_nats_secrets_stay_out_of_reprs() -> None:
    env = {
        "SHOAL_NATS__URL": "nats://a:url-secret@n1:4222,nats://token-in-url@n2:4222",
        "SHOAL_NATS__USER": "shoal",
        "SHOAL_NATS__PASSWORD": "field-secret",
    }
    settings = load_settings(env=env)
    for text in (repr(settings), str(settings), repr(settings.nats), settings.nats.display_url):
        assert "url-secret" not in text and "field-secret" not in text
        assert "token-in-url" not in text
    assert settings.nats.display_url == "nats://a:***@n1:4222,nats://***@n2:4222"
    assert "user='shoal'" in repr(settings.nats) and "password='***'" in repr(settings.nats)
    assert load_settings(env={}).nats.display_url == "nats://127.0.0.1:4222"


def test_a_mistyped_variable_is_named_in_a_warning_with_the_setting_it_resembles(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {
        "SHOAL_GATEWAY__PROT": "9100",
        "SHOAL_GATWAY__PORT": "9100",
        "SHOAL_API_KEY": "sk-shoal-x",  # the clients' key: not a setting, not warned of
        "SHOAL_GATEWAY__PORT": "9200",
    }
    with caplog.at_level(logging.WARNING, logger="shoal.config.load"):
        settings = load_settings(env=env)
    assert settings.gateway.port == 9200
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [
        "SHOAL_GATEWAY__PROT is not a Shoal setting and is ignored "
        "(did you mean SHOAL_GATEWAY__PORT?)",
        "SHOAL_GATWAY__PORT is not a Shoal setting and is ignored "
        "(did you mean SHOAL_GATEWAY__PORT?)",
    ]
