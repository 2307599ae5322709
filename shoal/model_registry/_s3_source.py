"""`s3://bucket/prefix` sources: listed, checked key by key, then downloaded into a cache.

Two rules keep a bucket from reaching past its own files:

- Every object key under the prefix must stay inside the download directory once joined
  to it. A key with a `..` segment (AWS S3 stores such keys as given) would write
  anywhere the worker may write, so one such key refuses the whole source before anything
  is downloaded, at registration as at load.
- Errors name the source (`s3://bucket/prefix`) and what went wrong (the S3 error code, or
  that the endpoint cannot be reached), never botocore's own message: that message carries
  the endpoint URL, which is deployment detail a caller of the admin API or of a model has
  no business seeing. The full error goes to the process's log.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

from ._errors import SourceError
from .cache_dirs import partial_dir, publish

__all__ = ["S3Object", "cache_target", "download", "list_objects", "split_uri"]

log = logging.getLogger(__name__)

_ERROR_CODE = re.compile(r"[A-Za-z0-9.]{1,64}")


class S3Object(NamedTuple):
    """One object of a source: its key and where it lands under the download directory."""

    key: str
    relative: PurePosixPath


def split_uri(uri: str) -> tuple[str, str]:
    """The bucket and the prefix (without slashes at its ends) of `s3://bucket/prefix`."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise SourceError(f"{uri}: no bucket")
    return bucket, prefix.strip("/")


def cache_target(cache_dir: Path, uri: str) -> Path:
    """The directory a source is downloaded to (one per URI)."""
    return cache_dir / "s3" / hashlib.sha256(uri.encode()).hexdigest()[:24]


def _why(exc: BaseException) -> str:
    """What went wrong, in words that name no endpoint and no credential."""
    from botocore.exceptions import (
        ClientError,
        HTTPClientError,
        NoCredentialsError,
        PartialCredentialsError,
    )
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        return f"S3 answered {code}" if _ERROR_CODE.fullmatch(code) else "S3 refused the request"
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return "the S3 endpoint cannot be reached"
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return "no S3 credentials are configured"
    if isinstance(exc, OSError):
        return f"the download cannot be written ({exc.strerror or type(exc).__name__})"
    return f"the S3 request failed ({type(exc).__name__})"


def _failed(uri: str, doing: str, exc: BaseException) -> SourceError:
    log.warning("%s: %s failed: %s", uri, doing, exc)
    return SourceError(f"{uri} cannot be {doing}: {_why(exc)}")


def _relative(uri: str, prefix: str, key: str) -> PurePosixPath | None:
    """Where `key` lands under the download directory; None for a folder marker.

    Raises:
        SourceError: the key would land outside it.
    """
    relative = key[len(prefix) :] if prefix else key
    # Leading slashes would make the join absolute; S3 keys may start with any number.
    relative = relative.lstrip("/")
    if not relative or relative.endswith("/"):
        return None
    path = PurePosixPath(relative)
    if ".." in path.parts:
        raise SourceError(
            f"{uri} holds an object whose key leads outside the model's directory "
            f"({key!r}); nothing of it is used"
        )
    return path


def list_objects(client: Any, uri: str) -> list[S3Object]:
    """Every object under the source's prefix, each checked to stay inside its directory.

    Raises:
        SourceError: the prefix cannot be listed, holds nothing, or holds a key that
            leads outside the download directory.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split_uri(uri)
    keys: list[str] = []
    try:
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""
        )
        for page in pages:
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
    except (BotoCoreError, ClientError) as exc:
        raise _failed(uri, "read", exc) from None
    if not keys:
        raise SourceError(f"{uri} holds no objects")
    objects = [S3Object(key, rel) for key in keys if (rel := _relative(uri, prefix, key))]
    if not objects:
        raise SourceError(f"{uri} holds no objects")
    return objects


def download(client: Any, uri: str, target: Path) -> None:
    """Download every object of `uri` into `target` (replaced whole once all arrived).

    Raises:
        SourceError: as `list_objects`, or a download failed.
    """
    objects = list_objects(client, uri)  # every key checked before anything is written
    bucket, _ = split_uri(uri)
    partial = partial_dir(target)
    try:
        for obj in objects:
            destination = partial.joinpath(*obj.relative.parts)
            destination.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, obj.key, str(destination))
        publish(partial, target)
    except Exception as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise _failed(uri, "downloaded", exc) from None
