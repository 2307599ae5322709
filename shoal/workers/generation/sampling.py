"""Choosing the next token for every running sequence at once.

Penalties, temperature, nucleus (top-p) and grammar masks are applied to the whole
`(rows, vocab)` logits batch with per-row parameters; only the draw itself is per row,
because each sequence samples from its own seeded generator (same seed and parameters,
same text, whatever else shares the batch).

Penalties follow OpenAI's definition: `logit -= presence * (count > 0) + frequency * count`
over the tokens generated so far. Log-probabilities are those of the model's own
distribution (before temperature and penalties), as OpenAI reports them.

A row whose draw fails is reported in `failed` and the other rows still get their
tokens: one sequence's parameters must never fail the sequences it shares a batch with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["GREEDY_BELOW", "RowParams", "sample"]

GREEDY_BELOW = 1e-5
"""Temperatures under this pick the likeliest token. Dividing float32 logits by a tiny
temperature overflows them to inf (and softmax to NaN); and already at 1e-5 a logit gap of
0.001 weighs e^100 against the runner-up, so the draw would be the argmax anyway."""


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
) -> tuple[list[int], list[float] | None, list[list[tuple[int, float]]] | None, dict[int, str]]:
    """Next token per row; its logprob and the top alternatives where asked.

    Args:
        logits: `(rows, vocab)` float32 scores for the next position.
        counts: `(rows, vocab)` how often each token was generated so far.
        allowed: `(rows, vocab)` bool grammar mask, or None.

    Returns:
        `(tokens, logprobs, top logprobs, failed)`: `failed` maps the rows whose draw
        failed to why; their entries in the other lists are placeholders.
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
    failed: dict[int, str] = {}
    for i, row in enumerate(rows):
        try:
            tokens.append(_draw(scores[i], row))
        except Exception as exc:  # reported per row: see the module docstring
            failed[i] = f"sampling failed: {exc}"
            tokens.append(0)
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
    return tokens, chosen, tops, failed


def _draw(scores: torch.Tensor, row: RowParams) -> int:
    """One row's next token.

    Raises:
        ValueError: no token is possible (every score -inf or NaN).
    """
    if row.temperature < GREEDY_BELOW:
        return int(scores.argmax())
    probs = torch.softmax(scores / row.temperature, dim=-1)
    if row.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(0) - sorted_probs < row.top_p
        # The likeliest token always stays: a top_p under float32's smallest number
        # compares as 0 and would keep none.
        keep[0] = True
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    if not bool(torch.isfinite(probs).all()) or not float(probs.sum()) > 0.0:
        raise ValueError("the next-token distribution is not a distribution")
    return int(torch.multinomial(probs, 1, generator=row.generator))
