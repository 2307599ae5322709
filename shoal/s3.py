"""One way to build a boto3 S3 client from Shoal's settings (model sources, object store)."""

from __future__ import annotations

from typing import Any

from .config import S3Settings

__all__ = ["s3_client"]


def s3_client(s3: S3Settings, read_timeout: float = 30.0) -> Any:
    """A boto3 S3 client; empty settings fields leave boto3 its usual configuration chain
    (AWS_* variables, ~/.aws, instance roles)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=s3.endpoint_url or None,
        region_name=s3.region or None,
        aws_access_key_id=s3.access_key_id or None,
        aws_secret_access_key=s3.secret_access_key or None,
        config=Config(connect_timeout=5, read_timeout=read_timeout, retries={"max_attempts": 2}),
    )
