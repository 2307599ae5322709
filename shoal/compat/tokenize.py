"""Tokenize and detokenize: `POST /tokenize` and `POST /detokenize` in vLLM's shapes, for
any model (a generation model's tokens are what its prompts cost and what its context
holds).

`/tokenize` takes a `prompt` (`add_special_tokens` defaults to true, as vLLM's does) or
chat `messages` (with `tools`, if any): a chat's tokens are exactly the prompt a chat
completion with the same messages and tools is given, chat template included.
`/detokenize` turns a list of ids back into text. The worker serving the model answers
both with the model's own tokenizer; TEI's `/tokenize` and `/decode` (tei.py) make the
same jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import msgspec

from ..config import GatewaySettings
from ..model_registry import ModelSpec
from ..queue.messages import TokenizeJob, TokensResult
from ..queue.subjects import Task
from ._constraints import ModelName
from .errors import InvalidRequestError
from .extensions import ShoalOptions
from .jobs import Envelope, check_count, check_token_ids, checked_texts, text_parts
from .openai.chat import ChatCompletionRequest, ChatMessage
from .openai.tools import Tool

__all__ = [
    "DecodeRequest",
    "Decoded",
    "DetokenizeRequest",
    "DetokenizeResponse",
    "TextsTokenizeRequest",
    "TokenizeRequest",
    "TokenizeResponse",
    "Tokens",
]


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """`POST /tokenize`'s body (vLLM's): a `prompt`, or chat `messages`."""

    op: ClassVar[Task] = "tokenize"

    model: ModelName
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None
    add_special_tokens: bool | None = None
    """Default: true for a prompt, false for messages (the chat template has them)."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    shoal: ShoalOptions | None = None

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[TokenizeJob]:
        if (self.prompt is None) == (self.messages is None):
            raise InvalidRequestError("send either 'prompt' or 'messages'", param="prompt")
        if self.prompt is not None:
            return [
                TokenizeJob(
                    **env.job_fields(0, 0),
                    texts=checked_texts([self.prompt], limits, "prompt"),
                    add_special_tokens=self.add_special_tokens is not False,
                )
            ]
        if not self.messages:
            raise InvalidRequestError("'messages' must not be empty", param="messages")
        # The chat's prompt is the one chat completions build, so its count is theirs.
        for name, value, served in (
            ("add_generation_prompt", self.add_generation_prompt, True),
            ("continue_final_message", self.continue_final_message, False),
            ("add_special_tokens", bool(self.add_special_tokens), False),
        ):
            if value != served:
                raise InvalidRequestError(
                    f"'{name}': only {str(served).lower()} is served for messages (the "
                    "prompt a chat completion is given)",
                    param=name,
                )
        chat = ChatCompletionRequest(model=self.model, messages=self.messages, tools=self.tools)
        turns = chat.turns(chat.tool_plan)
        checked_texts([t.content for t in turns], limits, "messages")
        return [TokenizeJob(**env.job_fields(0, 0), messages=turns)]

    def respond(self, results: Sequence[TokensResult], model: str) -> TokenizeResponse:
        result = results[0]
        ids = result.ids[0]
        strs = result.tokens[0] if self.return_token_strs else None
        return TokenizeResponse(
            count=len(ids), max_model_len=result.max_length, tokens=ids, token_strs=strs
        )


class TokenizeResponse(msgspec.Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    """`POST /detokenize`'s body (vLLM's): the ids of one text."""

    op: ClassVar[Task] = "tokenize"

    model: ModelName
    tokens: list[int]
    shoal: ShoalOptions | None = None

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[TokenizeJob]:
        check_token_ids([self.tokens], limits, "tokens")
        return [TokenizeJob(**env.job_fields(0, 0), ids=[self.tokens])]

    def respond(self, results: Sequence[TokensResult], model: str) -> DetokenizeResponse:
        return DetokenizeResponse(prompt=results[0].texts[0])


class DetokenizeResponse(msgspec.Struct):
    prompt: str


class TextsTokenizeRequest(msgspec.Struct, kw_only=True):
    """Many texts' tokens (TEI's `/tokenize` makes one), in parts as the other text
    routes split theirs."""

    op: ClassVar[Task] = "tokenize"

    model: str
    texts: list[str]
    add_special_tokens: bool = True
    shoal: ShoalOptions | None = None

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[TokenizeJob]:
        texts = checked_texts(self.texts, limits, "inputs")
        return [
            TokenizeJob(
                **env.job_fields(part, start),
                texts=texts[start:stop],
                add_special_tokens=self.add_special_tokens,
            )
            for part, (start, stop) in enumerate(text_parts(texts, limits))
        ]

    def respond(self, results: Sequence[TokensResult], model: str) -> Tokens:
        return Tokens(
            ids=[row for r in results for row in r.ids],
            tokens=[row for r in results for row in r.tokens],
            spans=[row for r in results for row in r.spans],
            special=[row for r in results for row in r.special],
        )


class Tokens(msgspec.Struct):
    """Per text: ids, vocabulary strings, character spans, special-token flags."""

    ids: list[list[int]]
    tokens: list[list[str]]
    spans: list[list[tuple[int, int]]]
    special: list[list[bool]]


class DecodeRequest(msgspec.Struct, kw_only=True):
    """Many lists of ids back to texts (TEI's `/decode` makes one)."""

    op: ClassVar[Task] = "tokenize"

    model: str
    ids: list[list[int]]
    skip_special_tokens: bool = True
    shoal: ShoalOptions | None = None

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[TokenizeJob]:
        check_count(len(self.ids), limits, "ids")
        check_token_ids(self.ids, limits, "ids")
        return [
            TokenizeJob(
                **env.job_fields(0, 0), ids=self.ids, skip_special_tokens=self.skip_special_tokens
            )
        ]

    def respond(self, results: Sequence[TokensResult], model: str) -> Decoded:
        return Decoded(texts=results[0].texts)


class Decoded(msgspec.Struct):
    texts: list[str]
