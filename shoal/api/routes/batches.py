"""/v1/batches (OpenAI-compatible): create, retrieve, list, cancel."""

from __future__ import annotations

import time
from typing import Annotated

import msgspec
from litestar import Controller, get, post
from litestar.params import Parameter

from ...compat.errors import ConflictError, InvalidRequestError, NotFoundError
from ...compat.openai.batches import FINAL_STATES, Batch, BatchList, CreateBatchRequest
from ..admission import caller_name, caller_scope
from ..answer import BATCH_ENDPOINTS
from ..batch_store import BatchRecord
from ..batches.runner import completion_window_seconds
from ..files import new_id
from ..gateway import GatewayDep
from ._openapi import CHANGE_ERRORS, RESOURCE_ERRORS, error_responses

__all__ = ["BatchesController"]


class BatchesController(Controller):
    path = "/v1/batches"
    tags = ["OpenAI"]

    @post(
        status_code=200,
        summary="Create a batch from an uploaded JSONL file",
        responses=error_responses(401, 403, 404, 413, 429),
    )
    async def create(self, data: CreateBatchRequest, gateway: GatewayDep) -> Batch:
        if data.endpoint not in BATCH_ENDPOINTS:
            raise InvalidRequestError(
                f"'{data.endpoint}' is not a batch endpoint; use one of "
                f"{', '.join(BATCH_ENDPOINTS)}",
                param="endpoint",
                code="invalid_endpoint",
            )
        window = completion_window_seconds(data.completion_window)
        if window is None:
            raise InvalidRequestError(
                f"'{data.completion_window}' is not a completion window; use '24h'",
                param="completion_window",
            )
        try:
            source = await gateway.files.get(data.input_file_id, caller_scope())
        except NotFoundError:
            raise InvalidRequestError(
                f"No such file: '{data.input_file_id}'",
                param="input_file_id",
                code="file_not_found",
            ) from None
        if source.purpose != "batch":
            raise InvalidRequestError(
                f"File '{source.id}' has purpose '{source.purpose}'; batches read files "
                "uploaded with purpose 'batch'",
                param="input_file_id",
            )
        await gateway.files.quota.check_room(caller_name())  # its output is stored too
        now = int(time.time())
        batch = Batch(
            id=new_id("batch_"),
            endpoint=data.endpoint,
            input_file_id=data.input_file_id,
            completion_window=data.completion_window,
            status="validating",
            created_at=now,
            expires_at=now + window,
            metadata=data.metadata,
        )
        await gateway.batches.create(BatchRecord(batch=batch, creator=caller_name()))
        return batch

    @get(summary="List batches, newest first", responses=RESOURCE_ERRORS)
    async def list_batches(
        self,
        gateway: GatewayDep,
        limit: Annotated[int, Parameter(ge=1, le=100)] = 20,
        after: str | None = None,
    ) -> BatchList:
        return await gateway.batches.list(limit, after or "", caller_scope())

    @get("/{batch_id:str}", summary="Retrieve a batch", responses=RESOURCE_ERRORS)
    async def retrieve(self, batch_id: str, gateway: GatewayDep) -> Batch:
        return (await gateway.batches.get(batch_id, caller_scope())).batch

    @post(
        "/{batch_id:str}/cancel", status_code=200, summary="Cancel a batch", responses=CHANGE_ERRORS
    )
    async def cancel(self, batch_id: str, gateway: GatewayDep) -> Batch:
        def cancelling(record: BatchRecord) -> BatchRecord | None:
            status = record.batch.status
            if status in FINAL_STATES or status in ("cancelling", "finalizing"):
                return None
            batch = msgspec.structs.replace(
                record.batch, status="cancelling", cancelling_at=int(time.time())
            )
            return msgspec.structs.replace(record, batch=batch)

        await gateway.batches.get(batch_id, caller_scope())  # another key's: not found
        record = await gateway.batches.change(batch_id, cancelling)
        if record.batch.status in ("completed", "failed", "expired", "finalizing"):
            raise ConflictError(
                f"Batch '{batch_id}' is {record.batch.status} and cannot be cancelled",
                code="batch_not_cancellable",
            )
        return record.batch
