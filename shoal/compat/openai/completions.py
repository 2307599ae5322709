"""OpenAI (legacy) completions: https://platform.openai.com/docs/api-reference/completions"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Annotated, Literal

import msgspec

from ...config import GatewaySettings
from ...model_registry import ModelSpec
from ...queue.messages import ChoiceDelta, GenerateJob, TokenLogprob
from .._constraints import ModelName
from ..errors import InvalidRequestError
from ..extensions import ShoalOptions
from ..jobs import Envelope, check_count, check_texts
from .generation import (
    CompletionUsage,
    DeltaStream,
    MaxTokens,
    SamplingFields,
    check_max_tokens,
    one_entry_per_choice,
)

__all__ = ["Completion", "CompletionChunk", "CompletionRequest"]


class CompletionRequest(SamplingFields, kw_only=True):
    """`POST /v1/completions`'s body; renders its response, streamed or whole."""

    model: ModelName
    prompt: str | list[str]
    best_of: Annotated[int, msgspec.Meta(ge=1)] | None = None
    echo: bool = False
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    max_tokens: MaxTokens = 16
    # --- Shoal extensions -------------------------------------------------------------
    shoal: ShoalOptions | None = None
    """Shoal extensions: `{"adapter": NAME}` picks a LoRA adapter of the model."""

    def prompts(self) -> list[str]:
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        if not prompts:
            raise InvalidRequestError("'prompt' must not be empty", param="prompt")
        return prompts

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> list[GenerateJob]:
        """One job per prompt, `n` choices each; choice `p * n + j` is prompt p's j-th.

        Raises:
            InvalidRequestError: unsupported parameters, a bad prompt, limits.
            PayloadTooLargeError: more prompts or characters than the gateway accepts.
        """
        self.reject_unsupported()
        if self.best_of not in (None, self.n):
            raise InvalidRequestError(
                "'best_of' other than 'n' is not supported",
                param="best_of",
                code="unsupported_parameter",
            )
        check_max_tokens(self.max_tokens, "max_tokens", limits, spec.max_length)
        prompts = self.prompts()
        check_count(len(prompts), limits, "prompt")
        check_texts(prompts, limits, "prompt")
        logprobs = self.logprobs is not None
        sampling = self.sampling(self.max_tokens, logprobs, self.logprobs or 0, "")
        return [
            GenerateJob(
                **env.job_fields(part, part * self.n),
                prompt=prompt,
                n=self.n,
                sampling=sampling,
                echo=self.echo,
            )
            for part, prompt in enumerate(prompts)
        ]

    async def collect(self, stream: DeltaStream) -> Completion:
        """The whole response, once the generation is done."""
        deltas = [d async for batch in stream for d in batch]
        usage = CompletionUsage.of(stream.prompt_tokens, stream.completion_tokens)
        prompts = stream.prompts if self.echo else [""] * stream.choices
        return Completion.collect(
            f"cmpl-{secrets.token_hex(12)}",
            stream.model,
            deltas,
            stream.choices,
            self.logprobs is not None,
            prompts,
            usage,
        )

    async def events(self, stream: DeltaStream) -> AsyncIterator[CompletionChunk]:
        """The streamed response: one chunk per engine step (the prompt before a choice's
        first text with `echo`), and with `include_usage` a last one with the usage."""
        cid, created, model = f"cmpl-{secrets.token_hex(12)}", int(time.time()), stream.model
        with_logprobs = self.logprobs is not None
        echoed: set[int] = set()
        async for deltas in stream:
            entries = []
            for d in deltas:
                text = d.text
                if self.echo and d.index not in echoed:
                    echoed.add(d.index)
                    text = stream.prompts[d.index] + text
                lps = LegacyLogprobs.of(d.logprobs, 0) if with_logprobs else None
                entries.append(CompletionChoice(text, d.index, lps, d.finish_reason or None))
            for choices in one_entry_per_choice(entries):
                yield CompletionChunk(cid, choices, created, model)
        if self.include_usage:
            usage = CompletionUsage.of(stream.prompt_tokens, stream.completion_tokens)
            yield CompletionChunk(cid, [], created, model, usage)


class LegacyLogprobs(msgspec.Struct):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]

    @classmethod
    def of(cls, logprobs: list[TokenLogprob], start: int) -> LegacyLogprobs:
        offsets = []
        at = start
        for lp in logprobs:
            offsets.append(at)
            at += len(bytes(lp.bytes).decode("utf-8", "replace")) if lp.bytes else len(lp.token)
        return cls(
            tokens=[lp.token for lp in logprobs],
            token_logprobs=[lp.logprob for lp in logprobs],
            top_logprobs=[{t: v for t, v, _ in lp.top} for lp in logprobs],
            text_offset=offsets,
        )


class CompletionChoice(msgspec.Struct):
    text: str
    index: int
    logprobs: LegacyLogprobs | None
    finish_reason: str | None


class Completion(msgspec.Struct):
    id: str
    choices: list[CompletionChoice]
    created: int
    model: str
    usage: CompletionUsage
    object: Literal["text_completion"] = "text_completion"

    @classmethod
    def collect(
        cls,
        completion_id: str,
        model: str,
        deltas: list[ChoiceDelta],
        n: int,
        with_logprobs: bool,
        prompts: list[str],
        usage: CompletionUsage,
    ) -> Completion:
        """`prompts[i]` is the echoed prompt of choice i ("" without echo)."""
        texts = list(prompts)
        lps: list[list[TokenLogprob]] = [[] for _ in range(n)]
        finish = ["stop"] * n
        for d in deltas:
            texts[d.index] += d.text
            lps[d.index].extend(d.logprobs)
            if d.finish_reason:
                finish[d.index] = d.finish_reason
        choices = [
            CompletionChoice(
                texts[i],
                i,
                LegacyLogprobs.of(lps[i], len(prompts[i])) if with_logprobs else None,
                finish[i],
            )
            for i in range(n)
        ]
        return cls(
            id=completion_id, choices=choices, created=int(time.time()), model=model, usage=usage
        )


class CompletionChunk(msgspec.Struct):
    id: str
    choices: list[CompletionChoice]
    created: int
    model: str
    usage: CompletionUsage | None = None
    object: Literal["text_completion"] = "text_completion"
