"""/v1/files (OpenAI-compatible): upload (streamed), list, retrieve, content, delete."""

from __future__ import annotations

from typing import Annotated

from litestar import Controller, Request, delete, get, post
from litestar.params import Parameter
from litestar.response import Stream

from ...compat.errors import InvalidRequestError
from ...compat.openai.files import FileDeleted, FileList, FileObject
from ..admission import caller_name, caller_scope
from ..gateway import GatewayDep
from ..uploads import receive_upload
from ._openapi import RESOURCE_ERRORS, error_responses

__all__ = ["FilesController"]

_UPLOAD_ERRORS = error_responses(401, 403, 413, 429, 503)


class FilesController(Controller):
    path = "/v1/files"
    tags = ["OpenAI"]

    # No body limit here: the upload streams to the object store, and `max_file_bytes` and
    # the storage quotas bound it as it goes.
    @post(
        status_code=200,
        summary="Upload a file (multipart)",
        request_max_body_size=None,
        responses=_UPLOAD_ERRORS,
    )
    async def upload(self, request: Request, gateway: GatewayDep) -> FileObject:
        files = gateway.files
        fields: dict[str, str] = {}
        owner = caller_name()

        async def store(filename: str, chunks) -> FileObject:
            async with files.quota.upload(owner) as metered:
                purpose = fields.get("purpose", "batch")
                return await files.add(filename, purpose, metered(chunks), owner=owner)

        stored = await receive_upload(
            request.stream(),
            request.headers.get("content-type", ""),
            store,
            gateway.settings.batches.max_file_bytes,
            fields,
        )
        purpose = fields.get("purpose", "")
        if stored is None:
            raise InvalidRequestError("'file' is required", param="file", code="missing")
        if not purpose:
            await files.delete(stored.id)
            raise InvalidRequestError("'purpose' is required", param="purpose", code="missing")
        if purpose != stored.purpose:  # the purpose came after the file part
            await files.delete(stored.id)
            raise InvalidRequestError(
                "Send the 'purpose' field before the 'file' part", param="purpose"
            )
        return stored

    @get(summary="List files", responses=RESOURCE_ERRORS)
    async def list_files(
        self,
        gateway: GatewayDep,
        purpose: str | None = None,
        limit: Annotated[int, Parameter(ge=1, le=10_000)] = 10_000,
        order: Annotated[str, Parameter(pattern="^(asc|desc)$")] = "desc",
        after: str | None = None,
    ) -> FileList:
        return await gateway.files.list(purpose, limit, order, after or "", caller_scope())

    @get("/{file_id:str}", summary="Retrieve a file's metadata", responses=RESOURCE_ERRORS)
    async def retrieve(self, file_id: str, gateway: GatewayDep) -> FileObject:
        return await gateway.files.get(file_id, caller_scope())

    @get(
        "/{file_id:str}/content",
        summary="Download a file",
        media_type="application/octet-stream",
        responses=RESOURCE_ERRORS,
    )
    async def content(self, file_id: str, gateway: GatewayDep) -> Stream:
        chunks = await gateway.files.content(file_id, caller_scope())
        return Stream(chunks, media_type="application/octet-stream")

    @delete("/{file_id:str}", status_code=200, summary="Delete a file", responses=RESOURCE_ERRORS)
    async def remove(self, file_id: str, gateway: GatewayDep) -> FileDeleted:
        return await gateway.files.delete(file_id, caller_scope())
