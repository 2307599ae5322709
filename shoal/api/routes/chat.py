"""POST /v1/chat/completions and /v1/completions (OpenAI-compatible), streaming or not."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator

import msgspec
from litestar import Controller, Response, post
from litestar.response import Stream

from ...compat.errors import ShoalError
from ...compat.openai.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
)
from ...compat.openai.completions import (
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionRequest,
    LegacyLogprobs,
)
from ...compat.openai.generation import Usage, chat_logprob
from ...queue.messages import ChoiceDelta
from .. import endpoints
from ..generation import Generation
from ..runtime import RuntimeDep
from ._openapi import WORK_ERRORS

__all__ = ["ChatController", "CompletionsController"]

_encode = msgspec.json.Encoder().encode
SSE = "text/event-stream"


def _sse(payload: object) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


async def _guarded(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """An error after the stream started cannot change the status any more: send it as
    an OpenAI error event, then end the stream."""
    try:
        async for event in events:
            yield event
    except ShoalError as exc:
        yield _sse(exc.to_response())
    yield b"data: [DONE]\n\n"


class ChatController(Controller):
    path = "/v1/chat/completions"
    tags = ["OpenAI"]

    @post(
        status_code=200,
        summary="Create a chat completion (SSE when stream is true)",
        responses=WORK_ERRORS,
    )
    async def create(
        self, data: ChatCompletionRequest, runtime: RuntimeDep
    ) -> Response[ChatCompletion] | Stream:
        if not data.stream:
            return Response(await endpoints.chat(runtime, data))
        generation, target = endpoints.start_chat(runtime, data)
        completion_id = f"chatcmpl-{secrets.token_hex(12)}"
        return Stream(
            _guarded(_chat_events(generation, data, completion_id, target.name)), media_type=SSE
        )


async def _chat_events(
    generation: Generation, data: ChatCompletionRequest, cid: str, model: str
) -> AsyncIterator[bytes]:
    created = int(time.time())
    first = [ChunkChoice(i, Delta(content="", role="assistant"), None, None) for i in range(data.n)]
    yield _sse(ChatCompletionChunk(cid, first, created, model))
    async for deltas in generation:
        choices = [_chat_choice(d, data.logprobs) for d in deltas]
        yield _sse(ChatCompletionChunk(cid, choices, created, model))
    if data.include_usage:
        usage = Usage.of(generation.prompt_tokens, generation.completion_tokens)
        yield _sse(ChatCompletionChunk(cid, [], created, model, usage))


def _chat_choice(d: ChoiceDelta, logprobs: bool) -> ChunkChoice:
    lps = ChoiceLogprobs([chat_logprob(lp) for lp in d.logprobs]) if logprobs else None
    return ChunkChoice(
        d.index, Delta(content=d.text or None) if d.text else Delta(), lps, d.finish_reason or None
    )


class CompletionsController(Controller):
    path = "/v1/completions"
    tags = ["OpenAI"]

    @post(
        status_code=200,
        summary="Create a completion (SSE when stream is true)",
        responses=WORK_ERRORS,
    )
    async def create(
        self, data: CompletionRequest, runtime: RuntimeDep
    ) -> Response[Completion] | Stream:
        if not data.stream:
            return Response(await endpoints.completion(runtime, data))
        generation, target = endpoints.start_completion(runtime, data)
        completion_id = f"cmpl-{secrets.token_hex(12)}"
        return Stream(
            _guarded(_completion_events(generation, data, completion_id, target.name)),
            media_type=SSE,
        )


async def _completion_events(
    generation: Generation, data: CompletionRequest, cid: str, model: str
) -> AsyncIterator[bytes]:
    created = int(time.time())
    with_logprobs = data.logprobs is not None
    echoed: set[int] = set()
    async for deltas in generation:
        choices = []
        for d in deltas:
            text = d.text
            if data.echo and d.index not in echoed:
                echoed.add(d.index)
                text = generation.prompts[d.index] + text
            lps = LegacyLogprobs.of(d.logprobs, 0) if with_logprobs else None
            choices.append(CompletionChoice(text, d.index, lps, d.finish_reason or None))
        yield _sse(CompletionChunk(cid, choices, created, model))
    if data.include_usage:
        usage = Usage.of(generation.prompt_tokens, generation.completion_tokens)
        yield _sse(CompletionChunk(cid, [], created, model, usage))
