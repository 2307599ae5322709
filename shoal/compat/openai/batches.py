"""OpenAI batches: https://platform.openai.com/docs/api-reference/batch

The batch object, the create request, and the per-line formats of the input, output and
error files.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "Batch",
    "BatchError",
    "BatchErrors",
    "BatchInputLine",
    "BatchList",
    "BatchOutputError",
    "BatchOutputLine",
    "BatchOutputResponse",
    "BatchStatus",
    "CreateBatchRequest",
    "RequestCounts",
]

BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
FINAL_STATES: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})


class CreateBatchRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    output_expires_after: dict[str, Any] | None = None


class BatchError(msgspec.Struct, kw_only=True):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(msgspec.Struct, kw_only=True):
    data: list[BatchError]
    object: Literal["list"] = "list"


class RequestCounts(msgspec.Struct, kw_only=True):
    total: int = 0
    completed: int = 0
    failed: int = 0


class Batch(msgspec.Struct, kw_only=True):
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    object: Literal["batch"] = "batch"
    model: str | None = None
    errors: BatchErrors | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = msgspec.field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None


class BatchList(msgspec.Struct, kw_only=True):
    data: list[Batch]
    has_more: bool
    first_id: str | None
    last_id: str | None
    object: Literal["list"] = "list"


class BatchInputLine(msgspec.Struct, kw_only=True):
    """One line of a batch input file."""

    custom_id: str
    method: str
    url: str
    body: msgspec.Raw


class BatchOutputResponse(msgspec.Struct, kw_only=True):
    status_code: int
    request_id: str
    body: msgspec.Raw


class BatchOutputError(msgspec.Struct, kw_only=True):
    code: str
    message: str


class BatchOutputLine(msgspec.Struct, kw_only=True):
    """One line of a batch output or error file; exactly one of `response`, `error` is
    set (a failed request keeps its response, with its status code and error body)."""

    id: str
    custom_id: str
    response: BatchOutputResponse | None
    error: BatchOutputError | None
