"""OpenAI models: https://platform.openai.com/docs/api-reference/models"""

from __future__ import annotations

from typing import Literal

import msgspec

from ...model_registry import ModelSpec

__all__ = ["Model", "ModelList"]


class Model(msgspec.Struct, kw_only=True):
    id: str
    created: int
    owned_by: str
    object: Literal["model"] = "model"
    # --- Shoal extensions -------------------------------------------------------------
    tasks: list[str]
    dims: int
    max_length: int
    aliases: list[str]
    ready: bool
    """Whether a live worker has this model loaded now."""
    parent: str | None = None
    """For a LoRA adapter (`base:adapter`): the base model."""
    engine: str | None = None
    """What runs it and in which precision (`openvino float32`), as its workers report;
    None until one has loaded it."""

    @classmethod
    def from_spec(
        cls, spec: ModelSpec, created: int, ready: bool, adapter: str = "", engine: str = ""
    ) -> Model:
        return cls(
            id=f"{spec.id}:{adapter}" if adapter else spec.id,
            parent=spec.id if adapter else None,
            created=created,
            owned_by=spec.owned_by,
            tasks=list(spec.tasks),
            dims=spec.dims,
            max_length=spec.max_length,
            aliases=[] if adapter else list(spec.aliases),
            ready=ready,
            engine=engine or None,
        )


class ModelList(msgspec.Struct):
    data: list[Model]
    object: Literal["list"] = "list"
