"""Settings for every Shoal process, loaded once and passed explicitly.

This is the only module that reads the environment. A process builds one `Settings`
in the CLI from, in increasing precedence: the defaults below, an optional TOML or JSON
file (`--config`), and `SHOAL_*` environment variables. Nested fields use a double
underscore: `SHOAL_GATEWAY__REQUEST_TIMEOUT=5`, `SHOAL_NATS__URL=nats://10.0.0.2:4222`,
`SHOAL_WORKER__MODELS=all-MiniLM-L6-v2,other` (lists are comma separated).
`SHOAL_DATA_DIR` is the top-level `data_dir`.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

import msgspec

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
    "default_data_dir",
    "load_settings",
    "read_keys",
]

ENV_PREFIX = "SHOAL_"


class NatsSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where NATS is and how Shoal's streams, consumers and buckets are shaped."""

    url: str = "nats://127.0.0.1:4222"
    """NATS server(s); a comma-separated list for a cluster."""
    user: str = ""
    """User name, with `password` (the server's `authorization` users)."""
    password: str = ""
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


class GatewaySettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The gateway's address and its limits on what one request may ask."""

    host: str = "127.0.0.1"
    port: int = 8000
    request_timeout: float = 120.0
    """Seconds a request may take end to end; past it the answer is 504."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Larger request bodies are refused with 413."""
    max_inputs: int = 100_000
    """Most inputs one request may carry (texts, documents, choices); more is a 413."""
    max_input_chars: int = 200_000
    """Longest single input (a text, a document, a message, a prompt) in characters; the
    gateway does no tokenization, so inputs are bounded by length (400)."""
    max_request_chars: int = 16_000_000
    """Most characters of input in one request (the gateway's bound on its tokens);
    more is a 413."""
    max_request_tokens: int = 4_000_000
    """Most token ids one pre-tokenized request may carry (413)."""
    max_tokens: int = 8192
    """Largest `max_tokens` (`max_completion_tokens`) a generation request may ask for."""
    max_in_flight: int = 2048
    """Requests one gateway process holds at once (waiting for workers); past it new
    ones get 429 before their body is read, so its memory stays bounded under overload."""
    max_body_bytes_in_flight: int = 0
    """Bytes of request bodies those requests may hold at once (a body's declared
    length, or `max_body_bytes` if it declares none); past it new ones get 429 before
    their body is read. 0: a sixteenth of the memory the process may use (its
    container's limit where lower). Never below `max_body_bytes`, so a request of the
    largest size always fits alone."""
    item_max_inputs: int = 32
    """A request is split into work items of at most this many inputs."""
    item_max_bytes: int = 256 * 1024
    """... and of at most this many bytes of text, so items stay far below NATS's 1 MiB."""
    no_worker_policy: Literal["reject", "queue"] = "reject"
    """With no live worker for a model: `reject` answers 503 at once, `queue` waits for one."""
    worker_ttl: float = 5.0
    """Seconds after its last heartbeat that a worker counts as gone."""
    uvicorn_workers: int = 1
    allowed_hosts: list[str] = []
    """Host names, besides loopback ones, that a gateway without API keys answers to (a
    name it is reached by through a local proxy, say). Others are refused, so a web page
    cannot re-point its own name at the gateway (DNS rebinding)."""
    cors_origins: list[str] = []
    """Browser origins (`https://app.example`) whose pages may call the API: CORS is
    answered for them. A state-changing request from any other page's origin is 403."""


class ApiKey(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One API key, stored as the SHA-256 of the key (never the key itself):
    `shoal keys new` makes a key and prints this entry."""

    name: str
    """Who holds it; logs and errors name the key by this, never by its value."""
    sha256: str
    """Hex SHA-256 of the key as clients send it (`Authorization: Bearer <key>`)."""
    models: list[str] = []
    """Models (ids or aliases) this key may use; empty: all."""
    routes: list[str] = []
    """Route groups this key may call (`embeddings`, `chat`, `completions`, `responses`,
    `models`, `files`, `batches`, `native`, `ner`, `multivector`, `rerank` (also
    `/v2/rerank` and `/v1/score`), `classify`, `sparse`); empty: all but `admin`."""
    admin: bool = False
    """Whether the key may call the admin API (`/admin/...`), besides its routes."""
    rpm: int = 0
    """Requests per minute; 0: the `auth.default_rpm`."""
    tpm: int = 0
    """Tokens per minute (input + output, as usage reports them); 0: `auth.default_tpm`."""


class AuthSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """API keys and per-key rate limits. With no keys, the gateway is open and binds to
    loopback only (a non-loopback bind then needs `allow_unauthenticated`)."""

    keys: list[ApiKey] = []
    """Keys given in the settings file, or as a JSON array in `SHOAL_AUTH__KEYS`."""
    keys_file: str = ""
    """A TOML (`[[keys]]` tables) or JSON (a list) file of more keys: a Kubernetes
    secret, say. Re-read while the gateway runs (`reload_seconds`)."""
    allow_unauthenticated: bool = False
    """Serve without keys on a non-loopback address (behind a proxy that authenticates)."""
    default_rpm: int = 0
    """Requests per minute for keys that set none; 0: unlimited."""
    default_tpm: int = 0
    """Tokens per minute for keys that set none; 0: unlimited."""
    reload_seconds: float = 2.0
    """How often a gateway re-reads `keys_file`: a key added, changed or removed there
    takes effect within this long, on every gateway, without a restart."""

    @property
    def configured(self) -> bool:
        """Whether keys are required: some are given, or a keys file is named (even one
        emptied to revoke every key, which then refuses every request)."""
        return bool(self.keys or self.keys_file)


class S3Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How S3 is reached, for `s3://` model and adapter sources and the `s3` object store.
    Empty fields leave boto3 its usual configuration chain (AWS_* variables, ~/.aws,
    instance roles)."""

    endpoint_url: str = ""
    """An S3-compatible endpoint (SeaweedFS, MinIO, ...); empty: AWS."""
    region: str = ""
    access_key_id: str = ""
    secret_access_key: str = ""


class ObjectStoreSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where uploaded files and batch outputs live."""

    backend: Literal["local", "s3"] = "local"
    """`local`: a directory, for one machine; `s3`: a bucket (with the `s3` settings),
    shared by every gateway of a cluster."""
    local_dir: str = ""
    """The `local` directory; default `data_dir/objects`."""
    bucket: str = "shoal"
    """The `s3` bucket (created if missing)."""
    prefix: str = ""
    """Key prefix inside the bucket, so deployments can share one."""


class BatchSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The Files and Batches API and the batch runner that gateways run."""

    run_batches: bool = True
    """Whether this gateway runs batches (any number of gateways may: they share the work
    through leases in JetStream KV)."""
    max_file_bytes: int = 8 << 30
    """Largest upload to /v1/files."""
    quota_bytes_per_key: Annotated[int, msgspec.Meta(ge=0)] = 100 << 30
    """Bytes of files one API key may store (uploads and batch outputs; without keys,
    everyone together). An upload past it is refused with 413 `storage_quota_exceeded`,
    and so is a new batch while the key's files fill it; deleting files makes room. A
    fixed figure rather than one read off a disk, so every gateway of a cluster enforces
    the same one (an S3 store has no free space to read)."""
    quota_bytes_total: Annotated[int, msgspec.Meta(ge=0)] = 1 << 40
    """Bytes of files all keys together may store, with the same refusals. The object
    store's own room is the hard bound: a full disk makes uploads fail (503) first."""
    max_line_bytes: Annotated[int, msgspec.Meta(ge=1)] = 32 << 20
    """Longest line of a batch input file, in bytes: a longer line fails the batch's
    validation (`line_too_long`, naming the line). A line is one request, so the default
    is the largest request body the live routes take (`gateway.max_body_bytes`).
    Validating or running a batch holds at most about twice this for its current line."""
    max_in_flight: int = 512
    """Lines of one batch queued or running at once (flow control)."""
    max_batches_running: int = 4
    """Batches one runner works on at once."""
    lease_seconds: float = 15.0
    """A runner that stops renewing its lease this long loses the batch to another."""
    flush_seconds: float = 1.0
    """How often finished lines are saved to the object store (what a restart keeps)."""
    item_timeout: float = 3600.0
    """Seconds one batch request may wait and run before it is retried."""
    cancel_grace: float = 10.0
    """Seconds in-flight requests of a cancelled batch get to finish."""
    max_validation_errors: int = 1000
    """Errors reported per failed validation (the rest are counted)."""
    pack_inputs: int = 64
    """Consecutive embeddings lines with the same model and options go to the queue as
    one request of up to this many inputs (each line still gets its own answer and counts
    as one line in flight); 1 sends every line alone."""


class WorkerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What an encoder worker serves, on which device, within which memory."""

    models: list[str] = msgspec.field(default_factory=lambda: ["*"])
    """Model ids this worker serves; `*` serves every model in the registry, including
    those registered later through the admin API."""
    pinned: list[str] = msgspec.field(default_factory=lambda: ["all-MiniLM-L6-v2"])
    """Models loaded at start and never evicted (those this worker serves). Others load
    on their first request and are evicted least recently used."""
    memory_budget: int = 0
    """Bytes of model weights this worker keeps resident; 0: 70% of the memory available
    at start (GPU memory on a CUDA device)."""
    max_adapters_per_model: int = 8
    """LoRA adapters kept loaded per base model; more are evicted least recently used."""
    device: str = "auto"
    """`auto` (CUDA when present), `cpu`, `cuda`, `cuda:1`, ..."""
    threads: int = 0
    """torch intra-op threads; 0 leaves torch's default (one per core)."""
    max_held_jobs: int = 64
    """Most work items one worker holds (pulled, not yet acked); the rest stay queued."""
    batch_slice_ms: float = 10.0
    """While live traffic is about, batch-lane forward passes are cut to take about this
    long (and run on half the CPU threads), so live requests wait little behind them."""
    heartbeat_interval: float = 1.0


class GeneratorSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a generation worker serves and with which runtime."""

    models: list[str] = msgspec.field(default_factory=lambda: ["*"])
    """Generation models this worker serves; `*` serves every model with the `generate`
    task in the spec files."""
    device: str = "auto"
    max_running: int = 0
    """Sequences generated at once (the continuous batch); 0: the model profile's
    `max_batch_items`."""
    sglang_command: list[str] = msgspec.field(
        default_factory=lambda: ["python", "-m", "sglang.launch_server"]
    )
    """How to start an SGLang server (its own environment's Python), for `sglang` models."""
    sglang_args: list[str] = msgspec.field(default_factory=list)
    """Extra flags for the SGLang server (e.g. `--mem-fraction-static 0.8`)."""
    sglang_start_timeout: float = 600.0
    openvino_export_command: list[str] = []
    """How to run `optimum-cli` for the OpenVINO runtime's one-time export of a model;
    empty: one beside this Python, else the `.venv-export` beside this venv (`make
    setup` builds it: optimum-intel pins an older transformers than Shoal's)."""
    min_weight_agreement: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.9
    """The least share of probe positions where a model with compressed weights
    (`weights = "int8"`) must pick the same next token as the full-precision one to be
    served compressed (SmolLM2-135M in int8: 0.95 on its own answers)."""
    openvino_draft_tokens: Annotated[int, msgspec.Meta(ge=0, le=16)] = 4
    """Speculative decoding of a lone greedy sequence on the OpenVINO runtime: the
    model's int8 copy drafts this many tokens and the full model checks them in one
    pass, keeping the ones it would have picked itself (the answer is the full model's;
    ~1.4x one stream's tokens/s on a 2-core EPYC). Only while that sequence is the only
    one. Its pipeline stays loaded (~1 GB more); in one session's runs there 8-32 streams
    were 3-10% slower with it loaded, in a later session's not at all
    (perf/results/README.md): 0 (off) saves the memory on a worker that is always busy."""
    openvino_cache_gb: float = 1.0
    """The OpenVINO runtime's KV cache per model, in GB (paged: shared by every running
    sequence)."""


class TelemetrySettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Traces (OTLP) and the metrics port of every process."""

    metrics_port: int = 0
    """A worker's `/metrics` port (Prometheus text); 0: none. The gateway serves
    `/metrics` on its own port."""
    metrics_host: str = "127.0.0.1"
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
    log_level: str = "info"
    serve_generation: bool = True
    """Whether `shoal serve` starts a generation worker beside the encoder worker."""
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
    def cache_dir(self) -> Path:
        """Where fetched and converted model files are kept (under `data_dir`)."""
        return Path(self.data_dir) / "cache"

    @property
    def model_root_paths(self) -> list[Path]:
        """`model_roots`, or `data_dir/models` when none is set."""
        return [Path(r) for r in self.model_roots] or [Path(self.data_dir) / "models"]


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
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        path = key[len(ENV_PREFIX) :].lower().split("__")
        target = raw
        struct: Any = Settings
        for part in path[:-1]:
            if part not in sections:
                break
            target = target.setdefault(part, {})
            struct = sections[part]
        else:
            names = {f.name: f for f in msgspec.structs.fields(struct)}
            field = names.get(path[-1])
            if field is None:
                continue  # SHOAL_* variables that are not settings belong to other tools
            is_list = getattr(field.type, "__origin__", None) is list
            if is_list and value.lstrip().startswith("["):
                target[path[-1]] = json.loads(value)  # a list of tables (API keys)
            elif is_list:
                target[path[-1]] = [v for v in value.split(",") if v]
            else:
                target[path[-1]] = value
