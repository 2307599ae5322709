"""Hugging Face text-embeddings-inference (TEI): its request and response shapes.

TEI serves one model per server, so its clients name no model: here each served model
has a TEI base URL, `/tei/{model}`, under which TEI's routes answer for that model
(`routes/tei.py`). Each TEI body becomes the Shoal request that does the same work
(`as_request`), and Shoal's answer becomes TEI's (`answer`). TEI's server option
`auto_truncate` is taken as on: an input longer than the model's limit is cut, unless
the body says `"truncate": false`.

Errors are TEI's `{"error": message, "error_type": kind}` (`error_body`).
"""

from __future__ import annotations

from typing import Literal

import msgspec
import numpy as np

from ..model_registry import ModelSpec
from .classify import ClassifyRequest, ClassifyResponse
from .compact import unit_rows
from .errors import InvalidRequestError, ShoalError
from .jobs import texts_of
from .openai import EmbeddingRequest, EmbeddingResponse
from .rerank import RerankRequest, RerankResponse
from .sparse import SparseRequest, SparseResponse
from .tokenize import Decoded, DecodeRequest, TextsTokenizeRequest, Tokens

__all__ = [
    "TeiDecode",
    "TeiEmbed",
    "TeiError",
    "TeiPredict",
    "TeiRerank",
    "TeiSimilarity",
    "TeiSparse",
    "TeiTokenize",
    "error_body",
    "info",
]

Direction = Literal["Left", "Right", "left", "right"]


def _right_only(direction: Direction) -> None:
    if direction.lower() != "right":
        raise InvalidRequestError(
            "truncation_direction 'Left' is not supported: inputs are cut at the end",
            param="truncation_direction",
        )


def _no_prompts(spec: ModelSpec, prompt_name: str | None) -> None:
    if prompt_name is not None:
        raise InvalidRequestError(
            f"model '{spec.id}' has no prompts; prompt_name '{prompt_name}' is unknown",
            param="prompt_name",
        )


class TeiEmbed(msgspec.Struct, kw_only=True):
    """`POST /embed` (and `POST /` for an embedding model, as `InferenceClient`'s
    `feature_extraction` sends it)."""

    inputs: str | list[str]
    normalize: bool = True
    truncate: bool = True
    truncation_direction: Direction = "Right"
    prompt_name: str | None = None
    dimensions: int | None = None

    def as_request(self, spec: ModelSpec) -> EmbeddingRequest:
        _right_only(self.truncation_direction)
        _no_prompts(spec, self.prompt_name)
        return EmbeddingRequest(
            input=self.inputs,
            model=spec.id,
            dimensions=self.dimensions,
            truncate=self.truncate,
        )

    def answer(self, response: EmbeddingResponse) -> list[list[float]]:
        rows = np.array([d.embedding for d in response.data], dtype=np.float32)
        # `normalize` adds a step; it never removes one the model ships (Haystack's TEI
        # embedders send false by default): a model that normalizes itself answers unit
        # vectors either way, as sentence-transformers gives them. Where it normalizes, a
        # no-op to float rounding.
        return (unit_rows(rows) if self.normalize else rows).tolist()


class TeiSimilarityInputs(msgspec.Struct):
    source_sentence: str
    sentences: list[str]


class TeiSimilarity(msgspec.Struct, kw_only=True):
    """`POST /similarity` (and `POST /` with `source_sentence`, as `InferenceClient`'s
    `sentence_similarity` sends it): cosine of each sentence to the source."""

    inputs: TeiSimilarityInputs
    truncate: bool = True

    def as_request(self, spec: ModelSpec) -> EmbeddingRequest:
        texts = [self.inputs.source_sentence, *self.inputs.sentences]
        return EmbeddingRequest(input=texts, model=spec.id, truncate=self.truncate)

    def answer(self, response: EmbeddingResponse) -> list[float]:
        rows = unit_rows(np.array([d.embedding for d in response.data], dtype=np.float32))
        return (rows[1:] @ rows[0]).tolist()


class TeiSparse(msgspec.Struct, kw_only=True):
    """`POST /embed_sparse`: each text's nonzero `{index, value}` pairs."""

    inputs: str | list[str]
    truncate: bool = True
    truncation_direction: Direction = "Right"

    def as_request(self, spec: ModelSpec) -> SparseRequest:
        _right_only(self.truncation_direction)
        return SparseRequest(model=spec.id, input=self.inputs, truncate=self.truncate)

    def answer(self, response: SparseResponse) -> list[list[dict]]:
        return [
            [{"index": i, "value": v} for i, v in zip(row.indices, row.values, strict=True)]
            for row in response.data
        ]


class TeiPredictParameters(msgspec.Struct, kw_only=True):
    top_k: int | None = None
    function_to_apply: str | None = None


class TeiPredict(msgspec.Struct, kw_only=True):
    """`POST /predict` (and `POST /` for a classifier, as `InferenceClient`'s
    `text_classification` sends it): labels with scores, best first; one list for one
    text, a list of lists for several."""

    inputs: str | list[str]
    raw_scores: bool = False
    truncate: bool = True
    truncation_direction: Direction = "Right"
    parameters: TeiPredictParameters | None = None

    def as_request(self, spec: ModelSpec) -> ClassifyRequest:
        _right_only(self.truncation_direction)
        function = self.parameters.function_to_apply if self.parameters else None
        if self.raw_scores or function not in (None, "softmax"):
            raise InvalidRequestError(
                "raw scores are not served: scores are the model's softmax probabilities",
                param="raw_scores",
            )
        top_k = self.parameters.top_k if self.parameters else None
        return ClassifyRequest(
            model=spec.id, input=self.inputs, top_k=top_k, truncate=self.truncate
        )

    def answer(self, response: ClassifyResponse) -> list:
        rows = [[{"score": x.score, "label": x.label} for x in d.labels] for d in response.data]
        return rows[0] if isinstance(self.inputs, str) else rows


class TeiRerank(msgspec.Struct, kw_only=True):
    """`POST /rerank`: `[{index, score, text?}]`, best first."""

    query: str
    texts: list[str]
    truncate: bool = True
    truncation_direction: Direction = "Right"
    raw_scores: bool = False
    return_text: bool = False

    def as_request(self, spec: ModelSpec) -> RerankRequest:
        _right_only(self.truncation_direction)
        if self.raw_scores:
            raise InvalidRequestError(
                "raw scores are not served: scores are the model's relevance scores",
                param="raw_scores",
            )
        return RerankRequest(
            model=spec.id, query=self.query, texts=self.texts, truncate=self.truncate
        )

    def answer(self, response: RerankResponse) -> list[dict]:
        return [
            {"index": r.index, "score": r.relevance_score}
            | ({"text": self.texts[r.index]} if self.return_text else {})
            for r in response.results
        ]


class TeiTokenize(msgspec.Struct, kw_only=True):
    """`POST /tokenize`: each text's tokens, `{id, text, special, start, stop}`; `text` is
    the input's characters `start:stop` (a special token's own string, with no span)."""

    inputs: str | list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None

    def as_request(self, spec: ModelSpec) -> TextsTokenizeRequest:
        _no_prompts(spec, self.prompt_name)
        return TextsTokenizeRequest(
            model=spec.id,
            texts=texts_of(self.inputs, "inputs"),
            add_special_tokens=self.add_special_tokens,
        )

    def answer(self, response: Tokens) -> list[list[dict]]:
        texts = texts_of(self.inputs, "inputs")
        return [
            [
                {"id": i, "text": token, "special": True, "start": None, "stop": None}
                if special
                else {"id": i, "text": text[a:b], "special": False, "start": a, "stop": b}
                for i, token, (a, b), special in zip(ids, tokens, spans, specials, strict=True)
            ]
            for text, ids, tokens, spans, specials in zip(
                texts, response.ids, response.tokens, response.spans, response.special, strict=True
            )
        ]


class TeiDecode(msgspec.Struct, kw_only=True):
    """`POST /decode`: the text of each list of ids (one list, or a list of lists)."""

    ids: list[int | list[int]]
    """One text's ids, or a list of them (msgspec takes no union of two list types)."""
    skip_special_tokens: bool = True

    def as_request(self, spec: ModelSpec) -> DecodeRequest:
        ids = self.ids
        if not ids:
            raise InvalidRequestError("`ids` cannot be empty", param="ids")
        if all(isinstance(i, int) for i in ids):
            lists: list[list[int]] = [ids]  # type: ignore[list-item]
        elif all(isinstance(i, list) for i in ids):
            lists = ids  # type: ignore[assignment]
        else:
            raise InvalidRequestError("`ids` must be ids or lists of ids, not both", param="ids")
        return DecodeRequest(model=spec.id, ids=lists, skip_special_tokens=self.skip_special_tokens)

    def answer(self, response: Decoded) -> list[str]:
        return response.texts


_MODEL_TYPES = {"embed": "embedding", "sparse": "embedding", "classify": "classifier"}


def info(spec: ModelSpec, max_client_batch_size: int, version: str) -> dict:
    """`GET /info`: what TEI says of its model, for this one."""
    kind = next((_MODEL_TYPES[t] for t in spec.tasks if t in _MODEL_TYPES), "reranker")
    return {
        "model_id": spec.id,
        "model_sha": None,
        "model_dtype": "float32",
        "model_type": {kind: {}},
        "max_concurrent_requests": None,
        "max_input_length": spec.max_length,
        "max_batch_tokens": spec.profile.max_batch_tokens,
        "max_batch_requests": None,
        "max_client_batch_size": max_client_batch_size,
        "auto_truncate": True,
        "tokenization_workers": None,
        "version": version,
        "sha": None,
        "docker_label": None,
    }


class TeiError(msgspec.Struct):
    """TEI's error body."""

    error: str
    error_type: str
    """`Validation`, `Overloaded`, `Backend`, ..."""


_ERROR_TYPES = {413: "Validation", 404: "Validation", 429: "Overloaded", 503: "Overloaded"}


def error_body(exc: ShoalError) -> tuple[int, dict]:
    """TEI's status and body for a Shoal error: a 400 is TEI's 422 (validation)."""
    status = 422 if exc.status_code == 400 else exc.status_code
    kind = _ERROR_TYPES.get(status, "Validation" if status < 500 else "Backend")
    return status, {"error": exc.message, "error_type": kind}
