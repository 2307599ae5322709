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
