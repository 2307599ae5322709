"""Choosing the next token for every running sequence at once.

Penalties, temperature, nucleus (top-p) and grammar masks are applied to the whole
`(rows, vocab)` logits batch with per-row parameters; only the draw itself is per row,
because each sequence samples from its own seeded generator (same seed and parameters,
same text, whatever else shares the batch).

Penalties follow OpenAI's definition: `logit -= presence * (count > 0) + frequency * count`
over the tokens generated so far. Log-probabilities are those of the model's own
distribution (before temperature and penalties), as OpenAI reports them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RowParams", "sample"]


@dataclass
class RowParams:
    temperature: float
    top_p: float
    presence: float
    frequency: float
    generator: torch.Generator
    top_logprobs: int
    want_logprobs: bool


def sample(
    logits: torch.Tensor,
    rows: list[RowParams],
    counts: torch.Tensor,
    allowed: torch.Tensor | None,
) -> tuple[list[int], list[float] | None, list[list[tuple[int, float]]] | None]:
    """Next token per row; its logprob and the top alternatives where asked.

    Args:
        logits: `(rows, vocab)` float32 scores for the next position.
        counts: `(rows, vocab)` how often each token was generated so far.
        allowed: `(rows, vocab)` bool grammar mask, or None.
    """
    logprobs = None
    if any(r.want_logprobs for r in rows):
        logprobs = torch.log_softmax(logits, dim=-1)
    presence = torch.tensor([r.presence for r in rows])
    frequency = torch.tensor([r.frequency for r in rows])
    scores = logits
    if presence.any() or frequency.any():
        scores = scores - presence[:, None] * (counts > 0) - frequency[:, None] * counts
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    tokens: list[int] = []
    for i, row in enumerate(rows):
        if row.temperature == 0.0:
            tokens.append(int(scores[i].argmax()))
            continue
        probs = torch.softmax(scores[i] / row.temperature, dim=-1)
        if row.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            keep = sorted_probs.cumsum(0) - sorted_probs < row.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        tokens.append(int(torch.multinomial(probs, 1, generator=row.generator)))
    chosen = tops = None
    if logprobs is not None:
        index = torch.tensor(tokens)[:, None]
        chosen = logprobs.gather(1, index)[:, 0].tolist()
        k = max(r.top_logprobs for r in rows)
        tops = [[] for _ in rows]
        if k:
            values, ids = logprobs.topk(k, dim=-1)
            for i, row in enumerate(rows):
                n = row.top_logprobs
                tops[i] = list(zip(ids[i, :n].tolist(), values[i, :n].tolist(), strict=True))
    return tokens, chosen, tops
