"""Cutting one request's inputs into work items, shared by the JSON and native routes.

A request becomes several items so several workers can share it; items stay well under
NATS's message limit both ways (texts in, vectors out).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ..config import GatewaySettings
from .errors import InvalidRequestError, PayloadTooLargeError

__all__ = [
    "RESULT_BYTES_PER_ITEM",
    "Envelope",
    "InputUsage",
    "check_count",
    "check_texts",
    "check_token_ids",
    "checked_texts",
    "split_points",
    "text_parts",
    "texts_of",
]

RESULT_BYTES_PER_ITEM = 768 * 1024
"""Most vector bytes one item's reply may carry (NATS's default max payload is 1 MiB)."""


def split_points(
    sizes: Sequence[int], max_items: int, max_bytes: int, row_bytes: int
) -> list[tuple[int, int]]:
    """`(start, stop)` ranges over the inputs: each range has at most `max_items` inputs,
    at most `max_bytes` of input (one oversized input travels alone), and a reply of at
    most `RESULT_BYTES_PER_ITEM` at `row_bytes` per vector."""
    max_items = max(1, min(max_items, RESULT_BYTES_PER_ITEM // max(row_bytes, 1)))
    ranges: list[tuple[int, int]] = []
    start = 0
    used = 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= max_items or used + size > max_bytes):
            ranges.append((start, i))
            start, used = i, 0
        used += size
    if sizes:
        ranges.append((start, len(sizes)))
    return ranges


class Envelope(msgspec.Struct, frozen=True):
    """What every job of one request shares: who asked, where to answer, until when."""

    request_id: str
    model: str
    reply_to: str
    deadline: float
    adapter: str = ""

    def job_fields(self, part: int, first_index: int) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "part": part,
            "model": self.model,
            "reply_to": self.reply_to,
            "deadline": self.deadline,
            "first_index": first_index,
            "adapter": self.adapter,
        }


def check_count(count: int, limits: GatewaySettings, param: str = "input") -> None:
    """Raises: InvalidRequestError (none), PayloadTooLargeError (over `max_inputs`)."""
    if count == 0:
        raise InvalidRequestError(f"'{param}' must not be empty", param=param)
    if count > limits.max_inputs:
        raise PayloadTooLargeError(
            f"{count} inputs in one request; the limit is {limits.max_inputs}", param=param
        )


def check_texts(
    texts: Sequence[str], limits: GatewaySettings, param: str = "input", already: int = 0
) -> int:
    """Bound a request's texts by length: the gateway never tokenizes, so characters stand
    in for the tokens a worker would have to read (and hold) before it can truncate.

    Args:
        already: characters the request carries besides `texts` (a rerank query).

    Returns:
        The characters counted, `already` included.

    Raises:
        InvalidRequestError: one text longer than `max_input_chars` (code input_too_long).
        PayloadTooLargeError: more than `max_request_chars` in all.
    """
    if not texts:
        return already
    lengths = [len(t) for t in texts]
    longest = max(lengths)
    if longest > limits.max_input_chars:
        index = lengths.index(longest)
        raise InvalidRequestError(
            f"'{param}[{index}]' has {longest} characters; the limit is "
            f"{limits.max_input_chars} per input",
            param=param,
            code="input_too_long",
        )
    total = already + sum(lengths)
    if total > limits.max_request_chars:
        raise PayloadTooLargeError(
            f"the request's inputs have {total} characters; the limit is "
            f"{limits.max_request_chars} per request",
            param=param,
        )
    return total


def check_token_ids(
    token_ids: Sequence[Sequence[int]], limits: GatewaySettings, param: str = "input"
) -> None:
    """Raises: PayloadTooLargeError for more than `max_request_tokens` ids in all."""
    total = sum(len(ids) for ids in token_ids)
    if total > limits.max_request_tokens:
        raise PayloadTooLargeError(
            f"the request has {total} token ids; the limit is {limits.max_request_tokens} "
            "per request",
            param=param,
        )


def texts_of(value: str | list[str], param: str = "input") -> list[str]:
    """A request's texts: one string, or a non-empty list.

    Raises: InvalidRequestError for an empty list."""
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise InvalidRequestError(f"'{param}' must not be empty", param=param)
    return texts


def checked_texts(texts: list[str], limits: GatewaySettings, param: str) -> list[str]:
    """`texts`, within the gateway's limits on their count and length."""
    check_count(len(texts), limits, param)
    check_texts(texts, limits, param)
    return texts


class InputUsage(msgspec.Struct):
    """Tokens a request's inputs used, as the workers counted them: the usage of every
    encoder route (OpenAI's embeddings, the native route, the tasks)."""

    prompt_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, results: Sequence[Any]) -> InputUsage:
        tokens = sum(r.prompt_tokens for r in results)
        return cls(tokens, tokens)


def text_parts(
    texts: Sequence[str], limits: GatewaySettings, row_bytes: int = 0
) -> list[tuple[int, int]]:
    """`split_points` over texts with the gateway's item limits."""
    return split_points(
        [len(t) for t in texts], limits.item_max_inputs, limits.item_max_bytes, row_bytes
    )
