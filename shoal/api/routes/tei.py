"""TEI's routes under each model's TEI base URL, `/tei/{model}`: point a TEI client
(`huggingface_hub.InferenceClient`, LangChain's `HuggingFaceEndpointEmbeddings`,
Haystack's TEI embedders) at `http://host:8000/tei/MODEL` and it works unmodified.

Bodies are TEI's (compat/tei.py), decoded here so that every error, a malformed body
included, comes back in TEI's shape (`{"error", "error_type"}`, 422 for a bad input).
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, Response, Router, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec

from ... import __version__
from ...compat.errors import ShoalError
from ...compat.tei import (
    TeiDecode,
    TeiEmbed,
    TeiError,
    TeiPredict,
    TeiRerank,
    TeiSimilarity,
    TeiSparse,
    TeiTokenize,
    error_body,
    info,
)
from ..answer import answer
from ..gateway import Gateway, GatewayDep

__all__ = ["TEI_ROUTER"]

_encode = msgspec.json.Encoder().encode
TeiBody = TeiEmbed | TeiPredict | TeiRerank | TeiSimilarity | TeiSparse | TeiTokenize | TeiDecode
_OP = {
    TeiEmbed: "embed",
    TeiSimilarity: "embed",
    TeiSparse: "sparse",
    TeiPredict: "classify",
    TeiRerank: "rerank",
    TeiTokenize: "tokenize",
    TeiDecode: "tokenize",
}


_ERRORS = {
    status: ResponseSpec(TeiError, description=what, generate_examples=False)
    for status, what in {
        400: "A malformed path",
        401: "No or a wrong API key (OpenAI's shape: checked before the route)",
        404: "No such model",
        413: "Too many inputs or characters",
        422: "An input the model cannot take (TEI's validation error)",
        429: "Overloaded",
    }.items()
}


def _json(content: Any, status: int = 200, headers: dict | None = None) -> Response[bytes]:
    return Response(
        _encode(content), status_code=status, media_type="application/json", headers=headers
    )


def _error(exc: ShoalError) -> Response[bytes]:
    status, error = error_body(exc)
    return _json(error, status)


def _invalid(message: str) -> Response[bytes]:
    return _json({"error": message, "error_type": "Validation"}, 422)


async def _run(gateway: Gateway, model: str, kind: type[TeiBody], raw: bytes) -> Response[bytes]:
    try:
        body = msgspec.json.decode(raw, type=kind)
        target = gateway.resolve(model, _OP[kind])
        answered = await answer(gateway, body.as_request(target.spec))
        return _json(body.answer(answered.body), headers=answered.headers)  # type: ignore[arg-type]
    except ShoalError as exc:
        return _error(exc)
    except msgspec.DecodeError as exc:  # ValidationError included
        return _invalid(f"Invalid request body: {exc}")


class _TeiController(Controller):
    """The routes that pick their body by the model (`/`) or read none (`/info`)."""

    path = "/"

    @post("/", responses=_ERRORS, summary="TEI's root: embed, similarity or predict, by model")
    async def root(self, model: str, request: Request, gateway: GatewayDep) -> Response[bytes]:
        """What `InferenceClient(base_url=...)` posts: `feature_extraction` and
        `sentence_similarity` for an embedding model, `text_classification` for a
        classifier, `embed_sparse` for a sparse one."""
        raw = await request.body()
        try:
            tasks = gateway.resolve(model, op=None).spec.tasks
            inputs = msgspec.json.decode(raw).get("inputs")
        except ShoalError as exc:
            return _error(exc)
        except (msgspec.DecodeError, AttributeError):
            return _invalid("the body must be a JSON object with 'inputs'")
        if "embed" in tasks:
            kind: type[TeiBody] = TeiSimilarity if isinstance(inputs, dict) else TeiEmbed
        elif "classify" in tasks:
            kind = TeiPredict
        elif "sparse" in tasks:
            kind = TeiSparse
        else:
            return _invalid(f"model '{model}' answers TEI's /rerank, not its root route")
        return await _run(gateway, model, kind, raw)

    @get("/info", responses=_ERRORS, summary="TEI: the model's limits")
    async def model_info(self, model: str, gateway: GatewayDep) -> Response[bytes]:
        try:
            spec = gateway.resolve(model, op=None).spec
        except ShoalError as exc:
            return _error(exc)
        return _json(info(spec, gateway.settings.gateway.max_inputs, __version__))


_BODY_ROUTES: dict[str, tuple[type[TeiBody], str]] = {
    "/embed": (TeiEmbed, "TEI: embed"),
    "/similarity": (TeiSimilarity, "TEI: cosine of sentences to a source sentence"),
    "/embed_sparse": (TeiSparse, "TEI: sparse (SPLADE) embed"),
    "/predict": (TeiPredict, "TEI: classify"),
    "/rerank": (TeiRerank, "TEI: rerank"),
    "/tokenize": (TeiTokenize, "TEI: tokenize (any model)"),
    "/decode": (TeiDecode, "TEI: token ids back to text (any model)"),
}
"""TEI's routes whose path names their body."""


def _body_route(path: str, kind: type[TeiBody], summary: str) -> HTTPRouteHandler:
    async def handle(model: str, request: Request, gateway: GatewayDep) -> Response[bytes]:
        return await _run(gateway, model, kind, await request.body())

    return post(path, responses=_ERRORS, summary=summary)(handle)


TEI_ROUTER = Router(
    path="/tei/{model:str}",
    tags=["TEI"],
    route_handlers=[
        _TeiController,
        *(_body_route(path, kind, summary) for path, (kind, summary) in _BODY_ROUTES.items()),
    ],
)
