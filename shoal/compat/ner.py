"""Named entities: `POST /v1/ner` (and the native route), entities per text with
character offsets into that text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

import msgspec

from ..config import GatewaySettings
from ..model_registry import ModelSpec
from ..queue.messages import NerJob, NerResult
from ..queue.subjects import Task
from ._constraints import ModelName, Score
from .extensions import ShoalOptions
from .jobs import Envelope, InputUsage, checked_texts, text_parts, texts_of

__all__ = ["NativeNerRequest", "NerEntity", "NerRequest", "NerResponse"]

Aggregation = Literal["none", "simple", "first", "max", "average"]


class NerRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/ner`'s body."""

    op: ClassVar[Task] = "ner"
    input_param: ClassVar[str] = "input"
    """The field holding the texts, for errors."""

    model: ModelName
    input: str | list[str]
    aggregation: Aggregation = "simple"
    """As transformers' token-classification pipeline's `aggregation_strategy`."""
    labels: list[str] | None = None
    """Keep only entities with these labels."""
    threshold: Score = 0.0
    """Drop entities scoring below this."""
    shoal: ShoalOptions | None = None
    """Shoal extensions: `{"adapter": NAME}` picks a LoRA adapter of the model."""

    def texts(self) -> list[str]:
        return texts_of(self.input)

    def respond(self, results: Sequence[NerResult], model: str) -> NerResponse:
        return NerResponse.from_results(self.texts(), results, model)

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[NerJob]:
        texts = checked_texts(self.texts(), limits, self.input_param)
        return [
            NerJob(
                **env.job_fields(part, start),
                texts=texts[start:stop],
                aggregation=self.aggregation,
                labels=self.labels or [],
                threshold=self.threshold,
            )
            for part, (start, stop) in enumerate(text_parts(texts, limits))
        ]


class NativeNerRequest(NerRequest, kw_only=True):
    """The native route's body: `inputs` instead of `input`, otherwise the same."""

    input_param: ClassVar[str] = "inputs"
    input: str | list[str] = ""
    inputs: list[str] = []

    def texts(self) -> list[str]:
        return texts_of(self.inputs, "inputs")


class NerEntity(msgspec.Struct):
    label: str
    text: str
    start: int
    end: int
    score: float


class NerData(msgspec.Struct):
    index: int
    entities: list[NerEntity]
    object: Literal["ner"] = "ner"


class NerResponse(msgspec.Struct):
    data: list[NerData]
    model: str
    usage: InputUsage
    object: Literal["list"] = "list"

    @classmethod
    def from_results(cls, texts: list[str], results: Sequence[NerResult], model: str):
        found = [entities for r in results for entities in r.entities]
        data = [
            NerData(
                i,
                [
                    NerEntity(e.label, text[e.start : e.end], e.start, e.end, e.score)
                    for e in entities
                ],
            )
            for i, (text, entities) in enumerate(zip(texts, found, strict=True))
        ]
        return cls(data=data, model=model, usage=InputUsage.of(results))
