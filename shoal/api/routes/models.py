"""GET /v1/models and /v1/models/{id} (OpenAI-compatible): models and their adapters."""

from __future__ import annotations

from litestar import Controller, get

from ...compat.openai import Model, ModelList
from ..runtime import RuntimeDep, Target

__all__ = ["ModelsController"]


def _card(runtime: RuntimeDep, target: Target, ready: set[str]) -> Model:
    return Model.from_spec(target.spec, runtime.started_at, target.spec.id in ready, target.adapter)


class ModelsController(Controller):
    path = "/v1/models"
    tags = ["OpenAI"]

    @get(summary="List models (LoRA adapters appear as `base:adapter`)")
    async def list_models(self, runtime: RuntimeDep) -> ModelList:
        ready = runtime.dispatcher.ready_models()
        cards = []
        for spec in runtime.registry:
            cards.append(_card(runtime, Target(spec), ready))
            cards.extend(
                _card(runtime, Target(spec, a.name), ready)
                for a in runtime.registry.adapters(spec.id)
            )
        return ModelList(data=cards)

    @get("/{model_id:path}", summary="Retrieve a model")
    async def retrieve(self, model_id: str, runtime: RuntimeDep) -> Model:
        target = runtime.resolve(model_id.lstrip("/"), op=None)
        return _card(runtime, target, runtime.dispatcher.ready_models())
