"""GET /v1/models and /v1/models/{id} (OpenAI-compatible): models and their adapters."""

from __future__ import annotations

from litestar import Controller, get

from ...compat.openai import Model, ModelList
from ..admission import current_principal
from ..runtime import RuntimeDep, Target
from ._openapi import RESOURCE_ERRORS

__all__ = ["ModelsController"]


def _card(runtime: RuntimeDep, target: Target, ready: set[str]) -> Model:
    return Model.from_spec(target.spec, runtime.started_at, target.spec.id in ready, target.adapter)


class ModelsController(Controller):
    path = "/v1/models"
    tags = ["OpenAI"]

    @get(summary="List models (LoRA adapters appear as `base:adapter`)", responses=RESOURCE_ERRORS)
    async def list_models(self, runtime: RuntimeDep) -> ModelList:
        ready = runtime.dispatcher.ready_models()
        principal = current_principal.get()
        cards = []
        for spec in runtime.registry:
            targets = [
                Target(spec),
                *(Target(spec, a.name) for a in runtime.registry.adapters(spec.id)),
            ]
            cards.extend(
                _card(runtime, t, ready)
                for t in targets
                if principal is None or principal.may_use(t.name, spec.id, *spec.aliases)
            )
        return ModelList(data=cards)

    @get("/{model_id:path}", summary="Retrieve a model", responses=RESOURCE_ERRORS)
    async def retrieve(self, model_id: str, runtime: RuntimeDep) -> Model:
        target = runtime.resolve(model_id.lstrip("/"), op=None)
        return _card(runtime, target, runtime.dispatcher.ready_models())
