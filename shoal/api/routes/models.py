"""GET /v1/models and /v1/models/{id} (OpenAI-compatible): models and their adapters."""

from __future__ import annotations

from litestar import Controller, get

from ...compat.openai import Model, ModelList
from ..admission import caller_may_use
from ..gateway import GatewayDep, Target
from ._openapi import RESOURCE_ERRORS

__all__ = ["ModelsController"]


def _card(gateway: GatewayDep, target: Target, ready: set[str]) -> Model:
    spec = target.spec
    engine = gateway.dispatcher.engines().get(spec.id, "")
    return Model.from_spec(spec, gateway.started_at, spec.id in ready, target.adapter, engine)


class ModelsController(Controller):
    path = "/v1/models"
    tags = ["OpenAI"]

    @get(summary="List models (LoRA adapters appear as `base:adapter`)", responses=RESOURCE_ERRORS)
    async def list_models(self, gateway: GatewayDep) -> ModelList:
        ready = gateway.dispatcher.ready_models()
        cards = []
        for spec in gateway.registry:
            targets = [
                Target(spec),
                *(Target(spec, a.name) for a in gateway.registry.adapters(spec.id)),
            ]
            cards.extend(
                _card(gateway, t, ready)
                for t in targets
                if caller_may_use(t.name, spec.id, *spec.aliases)
            )
        return ModelList(data=cards)

    @get("/{model_id:path}", summary="Retrieve a model", responses=RESOURCE_ERRORS)
    async def retrieve(self, model_id: str, gateway: GatewayDep) -> Model:
        target = gateway.resolve(model_id.lstrip("/"), op=None)
        return _card(gateway, target, gateway.dispatcher.ready_models())
