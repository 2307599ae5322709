"""Where files and batch outputs live, and S3."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = ["BatchSettings", "ObjectStoreSettings", "S3Settings"]


class S3Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How S3 is reached, for `s3://` model and adapter sources and the `s3` object store.
    Empty fields leave boto3 its usual configuration chain (AWS_* variables, ~/.aws,
    instance roles)."""

    endpoint_url: str = ""
    """An S3-compatible endpoint (SeaweedFS, MinIO, ...); empty: AWS."""
    region: str = ""
    """The S3 region; empty: boto3's own choice."""
    access_key_id: str = ""
    """With `secret_access_key`; empty: boto3's configuration chain."""
    secret_access_key: str = ""
    """Never logged; `shoal serve` hands it to its processes in a 0600 file."""


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
