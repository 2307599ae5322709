"""Classify: `POST /v1/classify`, labels with scores per text, best first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

import msgspec

from ..config import GatewaySettings
from ..model_registry import ModelSpec
from ..queue.messages import ClassifyJob, ClassifyResult
from ..queue.subjects import Task
from ._constraints import Count, ModelName
from .extensions import ShoalOptions
from .jobs import Envelope, InputUsage, checked_texts, text_parts, texts_of

__all__ = ["ClassLabel", "ClassifyData", "ClassifyRequest", "ClassifyResponse"]


class ClassifyRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/classify`'s body."""

    op: ClassVar[Task] = "classify"

    model: ModelName
    input: str | list[str]
    top_k: Count | None = None
    """Labels per text, best first; all of them when absent."""
    truncate: bool = True
    shoal: ShoalOptions | None = None
    """Shoal extensions: `{"adapter": NAME}` picks a LoRA adapter of the model."""

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[ClassifyJob]:
        texts = checked_texts(texts_of(self.input), limits, "input")
        return [
            ClassifyJob(
                **env.job_fields(part, start),
                texts=texts[start:stop],
                top_k=self.top_k or 0,
                truncate=self.truncate,
            )
            for part, (start, stop) in enumerate(text_parts(texts, limits))
        ]

    def respond(self, results: Sequence[ClassifyResult], model: str) -> ClassifyResponse:
        return ClassifyResponse.from_results(results, model)


class ClassLabel(msgspec.Struct):
    label: str
    score: float


class ClassifyData(msgspec.Struct):
    index: int
    labels: list[ClassLabel]
    object: Literal["classification"] = "classification"


class ClassifyResponse(msgspec.Struct):
    data: list[ClassifyData]
    model: str
    usage: InputUsage
    object: Literal["list"] = "list"

    @classmethod
    def from_results(cls, results: Sequence[ClassifyResult], model: str):
        rows = [labels for r in results for labels in r.labels]
        data = [
            ClassifyData(i, [ClassLabel(x.label, x.score) for x in labels])
            for i, labels in enumerate(rows)
        ]
        return cls(data=data, model=model, usage=InputUsage.of(results))
