"""Settings for every Shoal process, loaded once (`load_settings`) and passed explicitly.

One msgspec Struct per section, each in the module of its concern; `load.py` is the only
module that reads the environment.
"""

from .access import ApiKey, AuthSettings, GatewaySettings
from .load import client_api_key, default_data_dir, load_settings, read_keys
from .nats import NatsSettings
from .settings import Settings, TelemetrySettings
from .storage import BatchSettings, ObjectStoreSettings, S3Settings
from .workers import GeneratorSettings, WorkerSettings

__all__ = [
    "ApiKey",
    "AuthSettings",
    "BatchSettings",
    "GatewaySettings",
    "GeneratorSettings",
    "NatsSettings",
    "ObjectStoreSettings",
    "S3Settings",
    "Settings",
    "TelemetrySettings",
    "WorkerSettings",
    "client_api_key",
    "default_data_dir",
    "load_settings",
    "read_keys",
]
