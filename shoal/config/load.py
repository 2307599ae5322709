"""Loading settings: defaults, a file, the environment.

This is the only module that reads the environment. A process builds one `Settings`
in the CLI from, in increasing precedence: the defaults below, an optional TOML or JSON
file (`--config`), and `SHOAL_*` environment variables. Nested fields use a double
underscore: `SHOAL_GATEWAY__REQUEST_TIMEOUT=5`, `SHOAL_NATS__URL=nats://10.0.0.2:4222`,
`SHOAL_WORKER__MODELS=all-MiniLM-L6-v2,other` (lists are comma separated).
`SHOAL_DATA_DIR` is the top-level `data_dir`.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from .access import ApiKey
from .settings import Settings

__all__ = ["client_api_key", "default_data_dir", "load_settings", "read_keys"]

ENV_PREFIX = "SHOAL_"
_CLIENT_KEY = f"{ENV_PREFIX}API_KEY"
"""The command-line clients' key: a `SHOAL_*` variable that is not a setting."""

log = logging.getLogger(__name__)


def client_api_key(env: Mapping[str, str] | None = None, *, openai: bool = False) -> str:
    """The key the command-line clients (`shoal embed`, `shoal batch`) send when none is
    given: `SHOAL_API_KEY`, so that it stays out of the shell's history; with `openai`
    (`shoal batch`, an OpenAI API), else `OPENAI_API_KEY`, as the OpenAI SDK reads it."""
    env = os.environ if env is None else env
    return env.get(_CLIENT_KEY) or (env.get("OPENAI_API_KEY", "") if openai else "")


def default_data_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    home = env.get("HOME") or str(Path.home())
    base = env.get("XDG_DATA_HOME") or str(Path(home) / ".local" / "share")
    return Path(base) / "shoal"


def load_settings(
    config_file: str | Path | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Build the process's settings from defaults, an optional file and the environment.

    Raises:
        ValueError: when the file or a variable does not fit the settings' types.
    """
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    if config_file:
        path = Path(config_file)
        text = path.read_bytes()
        raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text.decode())
    _overlay_env(raw, env)
    try:
        settings = msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid settings: {exc}") from exc
    if not settings.data_dir:
        settings.data_dir = str(default_data_dir(env))
    settings.telemetry.otel = {k: v for k, v in env.items() if k.startswith("OTEL_")}
    return settings


def read_keys(path: Path, text: bytes | None = None) -> list[ApiKey]:
    """API keys from a TOML file of `[[keys]]` tables or a JSON list (`text`: its bytes,
    if already read).

    Raises:
        ValueError: the file cannot be read or does not hold key entries (the message
            names the file and the entry, never a key).
    """
    try:
        text = path.read_bytes() if text is None else text
    except OSError as exc:
        raise ValueError(f"keys file {path}: {exc.strerror}") from exc
    try:
        raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text.decode())
        if isinstance(raw, dict):
            raw = raw.get("keys", [])
        return msgspec.convert(raw, list[ApiKey])
    except (ValueError, msgspec.ValidationError) as exc:
        raise ValueError(f"invalid keys file {path}: {exc}") from exc


def _overlay_env(raw: dict[str, Any], env: Mapping[str, str]) -> None:
    sections = {
        f.name: f.type for f in msgspec.structs.fields(Settings) if isinstance(f.type, type)
    }
    unknown: list[str] = []
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX) or key == _CLIENT_KEY:
            continue
        path = key[len(ENV_PREFIX) :].lower().split("__")
        target = raw
        struct: Any = Settings
        for part in path[:-1]:
            if part not in sections:
                unknown.append(key)
                break
            target = target.setdefault(part, {})
            struct = sections[part]
        else:
            names = {f.name: f for f in msgspec.structs.fields(struct)}
            field = names.get(path[-1])
            if field is None:
                unknown.append(key)
                continue
            is_list = getattr(field.type, "__origin__", None) is list
            if is_list and value.lstrip().startswith("["):
                target[path[-1]] = json.loads(value)  # a list of tables (API keys)
            elif is_list:
                target[path[-1]] = [v for v in value.split(",") if v]
            else:
                target[path[-1]] = value
    known = _setting_variables(sections) if unknown else []
    for key in unknown:  # a typo would otherwise leave the default in force, unsaid
        near = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
        hint = f" (did you mean {near[0]}?)" if near else ""
        log.warning("%s is not a Shoal setting and is ignored%s", key, hint)


def _setting_variables(sections: Mapping[str, Any]) -> list[str]:
    """Every `SHOAL_*` variable that sets something."""
    names = []
    for f in msgspec.structs.fields(Settings):
        if issubclass(sections.get(f.name, str), msgspec.Struct):
            names += [
                f"{ENV_PREFIX}{f.name}__{g.name}".upper()
                for g in msgspec.structs.fields(sections[f.name])
            ]
        else:
            names.append(f"{ENV_PREFIX}{f.name}".upper())
    return names
