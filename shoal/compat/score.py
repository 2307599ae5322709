"""Score: `POST /v1/score` (and `/score`), vLLM's shape for a cross-encoder's relevance of
text pairs: `text_1` and `text_2` each a string or a list. One `text_1` is scored against
every `text_2` (1:N); two lists of the same length are scored pair by pair (N:N). The
scores are the rerank route's (the same jobs), in pair order, unsorted."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal

import msgspec

from ..config import GatewaySettings
from ..model_registry import ModelSpec
from ..queue.messages import RerankJob, ScoresResult
from ..queue.subjects import Task
from ._constraints import ModelName
from .errors import InvalidRequestError
from .extensions import ShoalOptions
from .jobs import Envelope, InputUsage, check_count
from .rerank import rerank_jobs

__all__ = ["ScoreData", "ScoreRequest", "ScoreResponse"]


class ScoreRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/score`'s body (vLLM's score API)."""

    op: ClassVar[Task] = "rerank"

    model: ModelName
    text_1: str | list[str]
    text_2: str | list[str]
    truncate_prompt_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Accepted as vLLM does; inputs longer than the model's limit are always cut to it."""
    shoal: ShoalOptions | None = None

    def pairs(self) -> list[tuple[str, str]]:
        """(text_1, text_2) in the order the scores are returned."""
        firsts = [self.text_1] if isinstance(self.text_1, str) else self.text_1
        seconds = [self.text_2] if isinstance(self.text_2, str) else self.text_2
        if not firsts:
            raise InvalidRequestError("'text_1' must not be empty", param="text_1")
        if not seconds:
            raise InvalidRequestError("'text_2' must not be empty", param="text_2")
        if len(firsts) == 1:
            return [(firsts[0], second) for second in seconds]
        if len(firsts) != len(seconds):
            raise InvalidRequestError(
                f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: send one text_1, "
                "or lists of the same length",
                param="text_2",
            )
        return list(zip(firsts, seconds, strict=True))

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[RerankJob]:
        pairs = self.pairs()
        check_count(len(pairs), limits, "text_2")
        jobs: list[RerankJob] = []
        index = 0
        # Consecutive pairs with the same first text share jobs (1:N is one query).
        for first, group in itertools.groupby(pairs, key=lambda pair: pair[0]):
            if not first.strip():
                raise InvalidRequestError("'text_1' must not be empty", param="text_1")
            seconds = [second for _, second in group]
            jobs += rerank_jobs(
                env, first, seconds, limits, first_part=len(jobs), first_index=index
            )
            index += len(seconds)
        return jobs

    def respond(self, results: Sequence[ScoresResult], model: str) -> ScoreResponse:
        scores = [s for r in results for s in r.scores]
        return ScoreResponse(
            id=f"score-{results[0].request_id}" if results else "score",
            created=int(time.time()),
            model=model,
            data=[ScoreData(index=i, score=float(s)) for i, s in enumerate(scores)],
            usage=InputUsage.of(results),
        )


class ScoreData(msgspec.Struct):
    index: int
    score: float
    object: Literal["score"] = "score"


class ScoreResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    data: list[ScoreData]
    usage: InputUsage
    object: Literal["list"] = "list"
