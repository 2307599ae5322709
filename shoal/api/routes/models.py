"""GET /v1/models and /v1/models/{id} (OpenAI-compatible), served from the registry."""

from __future__ import annotations

from litestar import Controller, get

from ...compat.openai import Model, ModelList
from ..runtime import RuntimeDep

__all__ = ["ModelsController"]


class ModelsController(Controller):
    path = "/v1/models"
    tags = ["OpenAI"]

    @get(summary="List models")
    async def list_models(self, runtime: RuntimeDep) -> ModelList:
        ready = runtime.dispatcher.ready_models()
        return ModelList(
            data=[
                Model.from_spec(spec, runtime.started_at, spec.id in ready)
                for spec in runtime.registry
            ]
        )

    @get("/{model_id:path}", summary="Retrieve a model")
    async def retrieve(self, model_id: str, runtime: RuntimeDep) -> Model:
        spec = runtime.resolve(model_id.lstrip("/"))
        return Model.from_spec(
            spec, runtime.started_at, spec.id in runtime.dispatcher.ready_models()
        )
