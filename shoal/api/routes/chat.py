"""POST /v1/chat/completions, /v1/completions and /v1/responses (OpenAI-compatible),
streaming or not."""

from __future__ import annotations

from litestar import Controller, Response, post
from litestar.response import Stream

from ...compat.openai.chat import ChatCompletion, ChatCompletionRequest
from ...compat.openai.completions import Completion, CompletionRequest
from ...compat.openai.responses import Response as ResponseObject
from ...compat.openai.responses import ResponseRequest
from ..answer import generate
from ..gateway import GatewayDep
from ._openapi import WORK_ERRORS

__all__ = ["ChatController", "CompletionsController", "ResponsesController"]


class ChatController(Controller):
    path = "/v1/chat/completions"
    tags = ["OpenAI"]

    @post(
        status_code=200,
        summary="Create a chat completion (SSE when stream is true)",
        responses=WORK_ERRORS,
    )
    async def create(
        self, data: ChatCompletionRequest, gateway: GatewayDep
    ) -> Response[ChatCompletion] | Stream:
        return await generate(gateway, data)


class CompletionsController(Controller):
    path = "/v1/completions"
    tags = ["OpenAI"]

    @post(
        status_code=200,
        summary="Create a completion (SSE when stream is true)",
        responses=WORK_ERRORS,
    )
    async def create(
        self, data: CompletionRequest, gateway: GatewayDep
    ) -> Response[Completion] | Stream:
        return await generate(gateway, data)


class ResponsesController(Controller):
    path = "/v1/responses"
    tags = ["OpenAI"]

    @post(
        status_code=200,
        summary="Create a model response (Responses API; SSE when stream is true)",
        responses=WORK_ERRORS,
    )
    async def create(
        self, data: ResponseRequest, gateway: GatewayDep
    ) -> Response[ResponseObject] | Stream:
        return await generate(gateway, data)
