"""OpenAI chat completions: https://platform.openai.com/docs/api-reference/chat"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Annotated, Literal

import msgspec

from ...config import GatewaySettings
from ...model_registry import ModelSpec
from ...queue.messages import ChatTurn, ChoiceDelta, GenerateJob
from .._constraints import ModelName
from ..errors import InvalidRequestError
from ..extensions import ShoalOptions
from ..jobs import Envelope, check_texts
from .generation import (
    ChatLogprob,
    DeltaStream,
    MaxTokens,
    ResponseFormat,
    SamplingFields,
    Usage,
    chat_logprob,
    check_max_tokens,
)

__all__ = [
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatMessage",
]


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    # Fields in the order of OpenAI's reference (SamplingFields holds the shared ones).
    """`POST /v1/chat/completions`'s body; renders its response, streamed or whole."""

    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    model: ModelName
    logprobs: bool = False
    max_completion_tokens: MaxTokens | None = None
    max_tokens: MaxTokens | None = None
    response_format: ResponseFormat | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    # --- Shoal extensions -------------------------------------------------------------
    shoal: ShoalOptions | None = None
    """Shoal extensions: `{"adapter": NAME}` picks a LoRA adapter of the model."""

    def turns(self) -> list[ChatTurn]:
        """Raises: InvalidRequestError for tool/function roles or non-text content."""
        turns = []
        for i, message in enumerate(self.messages):
            if message.role not in ("system", "developer", "user", "assistant"):
                raise InvalidRequestError(
                    f"messages[{i}]: role '{message.role}' is not supported "
                    "(system, developer, user, assistant)",
                    param=f"messages[{i}].role",
                )
            turns.append(ChatTurn(role=message.role, content=_text(message, i)))  # type: ignore[arg-type]
        return turns

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[GenerateJob]:
        """One job, `n` choices.

        Raises: InvalidRequestError (unsupported parameters, bad messages, limits),
        PayloadTooLargeError (more characters than `max_request_chars`)."""
        self.reject_unsupported()
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        # max_completion_tokens supersedes the deprecated max_tokens when both are set.
        if self.max_completion_tokens is not None:
            max_tokens, param = self.max_completion_tokens, "max_completion_tokens"
        else:
            max_tokens, param = self.max_tokens or 0, "max_tokens"
        check_max_tokens(max_tokens, param, limits, spec.max_length)
        turns = self.turns()
        check_texts([t.content for t in turns], limits, "messages")
        schema = self.response_format.schema_text() if self.response_format else ""
        sampling = self.sampling(max_tokens, self.logprobs, self.top_logprobs or 0, schema)
        return [GenerateJob(**env.job_fields(0, 0), messages=turns, n=self.n, sampling=sampling)]

    async def collect(self, stream: DeltaStream) -> ChatCompletion:
        """The whole response, once the generation is done."""
        deltas = [d async for batch in stream for d in batch]
        usage = Usage.of(stream.prompt_tokens, stream.completion_tokens)
        return ChatCompletion.collect(
            f"chatcmpl-{secrets.token_hex(12)}", stream.model, deltas, self.n, self.logprobs, usage
        )

    async def events(self, stream: DeltaStream) -> AsyncIterator[ChatCompletionChunk]:
        """The streamed response: a first chunk with the role, one per engine step, and
        with `include_usage` a last one with the usage."""
        cid, created, model = f"chatcmpl-{secrets.token_hex(12)}", int(time.time()), stream.model
        first = [
            ChunkChoice(i, Delta(content="", role="assistant"), None, None) for i in range(self.n)
        ]
        yield ChatCompletionChunk(cid, first, created, model)
        async for deltas in stream:
            choices = [_chunk_choice(d, self.logprobs) for d in deltas]
            yield ChatCompletionChunk(cid, choices, created, model)
        if self.include_usage:
            usage = Usage.of(stream.prompt_tokens, stream.completion_tokens)
            yield ChatCompletionChunk(cid, [], created, model, usage)


def _text(message: ChatMessage, i: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise InvalidRequestError(
                f"messages[{i}]: content parts of type '{part.type}' are not supported",
                param=f"messages[{i}].content",
            )
        parts.append(part.text)
    return "".join(parts)


class ResponseMessage(msgspec.Struct):
    content: str | None
    refusal: str | None = None
    role: Literal["assistant"] = "assistant"


class ChoiceLogprobs(msgspec.Struct):
    content: list[ChatLogprob] | None
    refusal: list[ChatLogprob] | None = None


class Choice(msgspec.Struct):
    index: int
    message: ResponseMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: str


class ChatCompletion(msgspec.Struct):
    id: str
    choices: list[Choice]
    created: int
    model: str
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"

    @classmethod
    def collect(
        cls,
        completion_id: str,
        model: str,
        deltas: list[ChoiceDelta],
        n: int,
        logprobs: bool,
        usage: Usage,
    ) -> ChatCompletion:
        """The whole response from every delta the stream gave, per choice in order."""
        texts = [""] * n
        lps: list[list[ChatLogprob]] = [[] for _ in range(n)]
        finish = ["stop"] * n
        for d in deltas:
            texts[d.index] += d.text
            lps[d.index].extend(chat_logprob(lp) for lp in d.logprobs)
            if d.finish_reason:
                finish[d.index] = d.finish_reason
        choices = [
            Choice(
                i,
                ResponseMessage(texts[i]),
                ChoiceLogprobs(lps[i]) if logprobs else None,
                finish[i],
            )
            for i in range(n)
        ]
        return cls(
            id=completion_id, choices=choices, created=int(time.time()), model=model, usage=usage
        )


class Delta(msgspec.Struct, omit_defaults=True):
    content: str | None = None
    role: str | None = None


class ChunkChoice(msgspec.Struct):
    index: int
    delta: Delta
    logprobs: ChoiceLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    choices: list[ChunkChoice]
    created: int
    model: str
    usage: Usage | None = None
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"


def _chunk_choice(d: ChoiceDelta, logprobs: bool) -> ChunkChoice:
    lps = ChoiceLogprobs([chat_logprob(lp) for lp in d.logprobs]) if logprobs else None
    return ChunkChoice(
        d.index, Delta(content=d.text or None) if d.text else Delta(), lps, d.finish_reason or None
    )
