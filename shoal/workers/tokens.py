"""Answering a `TokenizeJob` from a model's tokenizer, for every kind of worker.

The gateway never holds a tokenizer (DESIGN.md): TEI's `/tokenize` and `/decode` and
vLLM's `/tokenize` and `/detokenize` are jobs like any other, answered by the worker that
serves the model, with the tokenizer its model runs on, so the ids a caller sees are
the ids the model is given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from tokenizers import Tokenizer

from ..queue.messages import ChatTurn, TokenizeJob, TokensResult
from .core import Core, Held, Outcome

__all__ = ["answer_asked", "answers", "plain_tokenizer", "tokens_of"]

ChatIds = Callable[[Sequence[ChatTurn]], list[int]]
"""A chat's ids through the model's chat template (generation models)."""


def plain_tokenizer(backend: Tokenizer) -> Tokenizer:
    """A copy of `backend` that neither pads nor truncates: tokenizing says how long a
    text is, it does not cut it."""
    plain = Tokenizer.from_str(backend.to_str())
    plain.no_padding()
    plain.no_truncation()
    return plain


def tokens_of(
    tokenizer: Tokenizer, job: TokenizeJob, max_length: int, chat_ids: ChatIds | None = None
) -> TokensResult | str:
    """The job's answer, or why it cannot have one (an invalid input)."""
    common = {"request_id": job.request_id, "part": job.part, "max_length": max_length}
    if job.ids:
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        for i, ids in enumerate(job.ids):
            if any(not 0 <= t < size for t in ids):
                where = f"ids[{job.first_index + i}]"
                return f"{where}: token ids must be in [0, {size}) for this model"
        texts = tokenizer.decode_batch(job.ids, skip_special_tokens=job.skip_special_tokens)
        return TokensResult(**common, texts=texts)
    if job.messages:
        if chat_ids is None:
            return "this model has no chat template: send a prompt, not messages"
        ids = chat_ids(job.messages)
        return TokensResult(
            **common,
            ids=[ids],
            tokens=[[tokenizer.id_to_token(t) or "" for t in ids]],
            prompt_tokens=len(ids),
        )
    encodings = tokenizer.encode_batch(job.texts, add_special_tokens=job.add_special_tokens)
    return TokensResult(
        **common,
        ids=[e.ids for e in encodings],
        tokens=[e.tokens for e in encodings],
        spans=[
            [(0, 0) if s else o for o, s in zip(e.offsets, e.special_tokens_mask, strict=True)]
            for e in encodings
        ],
        special=[[bool(s) for s in e.special_tokens_mask] for e in encodings],
        prompt_tokens=sum(len(e.ids) for e in encodings),
    )


def answers(
    tokenizer: Tokenizer | None,
    jobs: Sequence[TokenizeJob],
    max_length: int,
    chat_ids: ChatIds | None = None,
) -> list[TokensResult | str]:
    """`tokens_of` for each job (off the event loop: a batch of long texts takes a while)."""
    if tokenizer is None:
        return ["this model has no tokenizer to tokenize with"] * len(jobs)
    return [tokens_of(tokenizer, job, max_length, chat_ids) for job in jobs]


async def answer_asked(
    core: Core, jobs: list[Held], answer: Callable[[list[TokenizeJob]], list[TokensResult | str]]
) -> list[Held]:
    """Answer the tokenize jobs among `jobs` with `answer` (run off the event loop: a batch
    of long texts takes a while); the other jobs, left to the caller."""
    asked = [held for held in jobs if held.op == "tokenize"]
    if not asked:
        return jobs
    replies = await asyncio.to_thread(answer, [held.job for held in asked])  # type: ignore[misc]
    for held, reply in zip(asked, replies, strict=True):
        if held.done:
            continue
        if isinstance(reply, str):
            await core.settle(held, Outcome.INVALID, reply)
        else:
            await core.answer(held, reply)
    return [held for held in jobs if held.op != "tokenize"]
