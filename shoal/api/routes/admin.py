"""Admin API: register and remove models and LoRA adapters without a redeploy.

Registrations go to the shared registry (a JetStream key-value bucket): every gateway and
worker sees them, and they survive restarts. A source is checked before anything is
stored, so a missing or unreachable S3 prefix leaves nothing half-registered; a local path
must lie under the model roots (setting `model_roots`).
"""

from __future__ import annotations

import asyncio
import re
from functools import partial
from typing import Annotated

from litestar import Controller, delete, get, post
from litestar.params import Parameter

from ...compat.admin import (
    AdapterRegistration,
    DeadLetterInfo,
    DeadLetterList,
    ModelInfo,
    ModelInfoList,
    WorkerInfo,
    WorkerStatus,
)
from ...compat.errors import ConflictError, InvalidRequestError, ModelNotFoundError, NotFoundError
from ...model_registry import (
    AdapterSpec,
    ModelSpec,
    RegistryConflictError,
    SourceError,
    UnknownAdapterError,
    UnknownModelError,
)
from ..gateway import Gateway, GatewayDep
from ._openapi import CHANGE_ERRORS, RESOURCE_ERRORS

__all__ = ["AdminController"]

_REGISTERED_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def _info(gateway: Gateway, spec: ModelSpec) -> ModelInfo:
    origin = "spec_file" if gateway.registry.is_builtin(spec.id) else "registered"
    return ModelInfo(spec, origin, gateway.registry.adapters(spec.id))  # type: ignore[arg-type]


async def _check_source(gateway: Gateway, source: str) -> None:
    # Held to the rules for run-time registrations: local paths only under the model
    # roots, packages found without importing them (see model_registry.sources).
    try:
        await asyncio.to_thread(partial(gateway.sources.check, source, registered=True))
    except SourceError as exc:
        raise InvalidRequestError(
            f"source {source!r} cannot be used: {exc}", param="source", code="source_unavailable"
        ) from None


class AdminController(Controller):
    path = "/admin/v1"
    tags = ["Admin"]

    @get(
        "/models",
        summary="Models, where each comes from, and their adapters",
        responses=RESOURCE_ERRORS,
    )
    async def list_models(self, gateway: GatewayDep) -> ModelInfoList:
        return ModelInfoList([_info(gateway, spec) for spec in gateway.registry])

    @post("/models", status_code=201, summary="Register a model", responses=CHANGE_ERRORS)
    async def register_model(self, data: ModelSpec, gateway: GatewayDep) -> ModelInfo:
        if not _REGISTERED_ID.fullmatch(data.id):
            raise InvalidRequestError(
                "registered model ids use letters, digits, '.', '_' and '-' only "
                "(give hub-style names as aliases)",
                param="id",
            )
        await _check_source(gateway, data.source)
        try:
            await gateway.registry.register_model(data)
        except RegistryConflictError as exc:
            raise ConflictError(str(exc), param="id") from None
        return _info(gateway, data)

    @delete(
        "/models/{model_id:str}",
        status_code=204,
        summary="Remove a registered model",
        responses=CHANGE_ERRORS,
    )
    async def remove_model(self, model_id: str, gateway: GatewayDep) -> None:
        try:
            await gateway.registry.remove_model(model_id)
        except UnknownModelError:
            raise ModelNotFoundError(model_id) from None
        except RegistryConflictError as exc:
            raise ConflictError(str(exc), param="model") from None

    @get("/models/{model_id:str}/adapters", summary="A model's adapters", responses=RESOURCE_ERRORS)
    async def list_adapters(self, model_id: str, gateway: GatewayDep) -> list[AdapterSpec]:
        spec = gateway.resolve(model_id, op=None).spec
        return gateway.registry.adapters(spec.id)

    @post(
        "/models/{model_id:str}/adapters",
        status_code=201,
        summary="Register a LoRA adapter",
        responses=CHANGE_ERRORS,
    )
    async def register_adapter(
        self, model_id: str, data: AdapterRegistration, gateway: GatewayDep
    ) -> AdapterSpec:
        spec = gateway.resolve(model_id, op=None).spec
        if spec.runtime not in ("sentence-transformers", "transformers", "sglang"):
            raise InvalidRequestError(
                f"model '{spec.id}' (runtime {spec.runtime}) cannot take LoRA adapters",
                param="model",
            )
        await _check_source(gateway, data.source)
        adapter = data.to_spec(spec.id)
        try:
            await gateway.registry.register_adapter(adapter)
        except RegistryConflictError as exc:
            raise ConflictError(str(exc), param="name") from None
        return adapter

    @delete(
        "/models/{model_id:str}/adapters/{name:str}",
        status_code=204,
        summary="Remove a LoRA adapter",
        responses=CHANGE_ERRORS,
    )
    async def remove_adapter(self, model_id: str, name: str, gateway: GatewayDep) -> None:
        spec = gateway.resolve(model_id, op=None).spec
        try:
            await gateway.registry.remove_adapter(spec.id, name)
        except UnknownAdapterError:
            raise NotFoundError(
                f"model '{spec.id}' has no adapter '{name}'", code="adapter_not_found"
            ) from None

    @get(
        "/status",
        summary="Workers: what each serves, holds in memory, loaded, evicted",
        responses=RESOURCE_ERRORS,
    )
    async def status(self, gateway: GatewayDep) -> WorkerStatus:
        beats = sorted(gateway.dispatcher.live_workers(), key=lambda w: w.worker_id)
        return WorkerStatus([WorkerInfo.of(beat) for beat in beats])

    @get(
        "/dead-letters",
        summary="Work items given up on after max_deliver (or unreadable), newest first",
        responses=RESOURCE_ERRORS,
    )
    async def dead_letters(
        self,
        gateway: GatewayDep,
        limit: Annotated[int, Parameter(ge=1, le=1000)] = 100,
        model: str = "",
    ) -> DeadLetterList:
        letters = await gateway.dead_letters.recent(limit, model)
        return DeadLetterList([DeadLetterInfo.of(seq, letter) for seq, letter in letters])
