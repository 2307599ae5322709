"""One encoder batch on a forward thread: its intra-op threads, its LoRA adapter, and
a failing input isolated from its batch mates."""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..adapters import EncoderAdapter
from ..adapters._openvino import side_by_side
from ..adapters.base import Tokenized
from .held import EncoderHeld

__all__ = ["forward_isolating", "prepare", "too_long"]

log = logging.getLogger(__name__)


def _forward(
    adapter: EncoderAdapter, op: str, lora: str, toks: list[Tokenized], threads: int, beside: bool
):
    """One batch, with its LoRA adapter active (or the base), on `threads` threads; with
    `beside`, in one of two engine streams sharing them (`runs_side_by_side` said so)."""
    if beside:
        with side_by_side(threads):
            return adapter.forward(op, toks)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if adapter.lora is None:
        return adapter.forward(op, toks)
    with adapter.lora.active(lora):
        return adapter.forward(op, toks)


def forward_isolating(
    adapter: EncoderAdapter,
    op: str,
    lora: str,
    toks: list[Tokenized],
    threads: int,
    beside: bool = False,
) -> tuple[list[Any], dict[int, str]]:
    """The batch's outputs; when the pass raises, the batch again in halves down to
    single inputs, so one poison input fails alone (at a cost of about 2 log2(n) extra
    passes, only on failure). Returns each input's output (None where it failed) and the
    failures by position."""
    try:
        return list(_forward(adapter, op, lora, toks, threads, beside)), {}
    except Exception as exc:
        if len(toks) == 1:
            log.debug("forward failed on one input", exc_info=True)
            return [None], {0: f"{type(exc).__name__}: {exc}"[:500]}
    half = len(toks) // 2
    left, left_errors = forward_isolating(adapter, op, lora, toks[:half], threads, beside)
    right, right_errors = forward_isolating(adapter, op, lora, toks[half:], threads, beside)
    errors = {**left_errors, **{half + i: e for i, e in right_errors.items()}}
    return left + right, errors


def prepare(adapter: EncoderAdapter, jobs: list[EncoderHeld]) -> list[list[Tokenized] | str]:
    """On the tokenizer thread: each job's rows; a job whose inputs the model cannot take
    gets an error message instead."""
    out: list[list[Tokenized] | str] = []
    for held in jobs:
        try:
            out.append(adapter.units(held.job))
        except ValueError as exc:
            out.append(str(exc))
    return out


def too_long(held: EncoderHeld, index: int, tok: Tokenized, limit: int) -> str:
    return (
        f"input {held.job.first_index + index} has {tok.full_length} tokens, more than the "
        f"model's maximum of {limit}; shorten it or send truncate=true"
    )
