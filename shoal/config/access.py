"""Who may call the gateway and how much: its address and request limits, API keys."""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["ApiKey", "AuthSettings", "GatewaySettings"]


class GatewaySettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The gateway's address and its limits on what one request may ask."""

    host: str = "127.0.0.1"
    """The address the gateway listens on; beyond loopback it needs API keys (or
    `auth.allow_unauthenticated`)."""
    port: int = 8000
    """The gateway's port (`shoal serve --gateways N` uses it and the ports after it)."""
    request_timeout: float = 120.0
    """Seconds a request may take end to end; past it the answer is 504."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Larger request bodies are refused with 413."""
    head_timeout: float = 10.0
    """Seconds a request's head (its line and headers) may take to arrive, from the
    connection opening or the previous response; a connection that sends nothing in that
    time is closed, one that sent part of a head gets 408."""
    body_timeout: float = 20.0
    """Seconds a request's body may take to arrive, from its head, plus one second for
    every `body_min_rate` bytes that do (a large upload on a slow link passes, a trickle
    gets 408)."""
    body_min_rate: int = 500
    """Bytes per second a request's body must keep up, past `body_timeout`."""
    write_timeout: float = 30.0
    """Seconds a client may leave its answer unread (the connection's buffers full)
    before the gateway cuts it off; a stream it does not read then ends, and so does
    its generation."""
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
    """Not read: a gateway is one uvicorn process; for more, run more gateways."""
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
