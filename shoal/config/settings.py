"""One process's settings: every section, and the data and cache directories."""

from __future__ import annotations

from pathlib import Path

import msgspec

from .access import AuthSettings, GatewaySettings
from .nats import NatsSettings
from .storage import BatchSettings, ObjectStoreSettings, S3Settings
from .workers import GeneratorSettings, WorkerSettings

__all__ = ["Settings", "TelemetrySettings"]


class TelemetrySettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Traces (OTLP) and the metrics port of every process."""

    metrics_port: int = 0
    """A worker's `/metrics` port (Prometheus text); 0: none. The gateway serves
    `/metrics` on its own port."""
    metrics_host: str = "127.0.0.1"
    """The address a worker's `/metrics` listens on (loopback unless set)."""
    otel: dict[str, str] = {}
    """The standard `OTEL_*` variables of the environment (traces are off unless they
    name an exporter or an OTLP endpoint); filled in by `load_settings`."""


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything one Shoal process reads, loaded once in the CLI (defaults, file, env)."""

    data_dir: str = ""
    """Where the embedded nats-server keeps its data; default: the per-user data dir."""
    models_file: str = ""
    """A user model spec (TOML) merged over the built-in one."""
    model_roots: list[str] = msgspec.field(default_factory=list)
    """Directories that local-path sources registered at run time (the admin API) must lie
    in, symlinks followed, links inside a source included; empty: `data_dir/models`. A
    path anywhere else is refused with one message whether or not it exists, so the admin
    API reveals and reads nothing outside them. The default is a directory Shoal owns and
    nothing else writes: registering works once a model is copied there, and no system
    file is in reach. Spec files (`models_file`) are the operator's own and may name any
    path."""
    cache_dir: str = ""
    """Where fetched and converted model files are kept (S3 downloads, a GGUF's
    safetensors copy, OpenVINO IR exports), each under a key of what it was made from,
    written whole or not at all, so processes with different data dirs may share one;
    empty: `data_dir/cache`."""
    log_level: str = "info"
    """`debug`, `info`, `warning` or `error` (`--log-level` on the command line)."""
    serve_generation: bool = True
    """Whether `shoal serve` starts a generation worker beside the encoder worker."""
    demo: bool = False
    """Serve the demo models too (`shoal serve --demo`): tiny NER, rerank, classify,
    sparse and multi-vector models with random heads (`demo-ner`, `demo-reranker`,
    `demo-classifier`, `demo-splade`, `demo-colbert`, owned by `shoal-demo`), so that
    every task can be tried offline. `shoal serve` builds them once (seconds) into
    `data_dir/demo-models`."""
    nats: NatsSettings = msgspec.field(default_factory=NatsSettings)
    s3: S3Settings = msgspec.field(default_factory=S3Settings)
    objects: ObjectStoreSettings = msgspec.field(default_factory=ObjectStoreSettings)
    batches: BatchSettings = msgspec.field(default_factory=BatchSettings)
    gateway: GatewaySettings = msgspec.field(default_factory=GatewaySettings)
    auth: AuthSettings = msgspec.field(default_factory=AuthSettings)
    worker: WorkerSettings = msgspec.field(default_factory=WorkerSettings)
    generator: GeneratorSettings = msgspec.field(default_factory=GeneratorSettings)
    telemetry: TelemetrySettings = msgspec.field(default_factory=TelemetrySettings)

    @property
    def cache_path(self) -> Path:
        """`cache_dir`, or `data_dir/cache` when none is set."""
        return Path(self.cache_dir or Path(self.data_dir) / "cache")

    @property
    def demo_spec(self) -> Path:
        """The demo models' spec, `data_dir/demo-models/models.toml`."""
        return Path(self.data_dir) / "demo-models" / "models.toml"

    @property
    def spec_files(self) -> list[Path]:
        """The model spec files over the built-in one, in order: the demo spec (with
        `demo`), then `models_file`."""
        files = [self.demo_spec] if self.demo else []
        return files + ([Path(self.models_file)] if self.models_file else [])

    @property
    def model_root_paths(self) -> list[Path]:
        """`model_roots`, or `data_dir/models` when none is set."""
        return [Path(r) for r in self.model_roots] or [Path(self.data_dir) / "models"]
