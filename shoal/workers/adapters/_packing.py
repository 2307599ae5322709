"""Packed rows: several inputs share one row of a batch, each attending only to itself.

A padded batch computes every row to its longest input. Short texts of mixed lengths
(queries of 10-30 tokens) waste about a third of the work that way (batches of requests as
they come against batches sorted by length over the whole set: perf/results). A server
cannot sort over requests it has not seen, but it can pack: inputs are laid end to end in
rows of one width, each with its own position ids from 0, and a block-diagonal attention
mask keeps each input to its own tokens. The model then computes what it would for each
input alone (the guard at load checks it against float32 torch on padded batches), on
almost no padding; attention over the wider rows costs `width / (2 * hidden +
intermediate)` of the matmuls per token (3% for MiniLM at width 64).

This is for encoders with absolute or rotary positions taken from `position_ids` (from 0,
or from padding_idx + 1 as RoBERTa numbers them) and an attention mask honoured as given
(transformers passes a 4D mask through unchanged); the load-time check turns packing off
for a model where either does not hold.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from .base import Tokenized

__all__ = ["Packed", "PackedGraph", "alpha_of", "pack", "packed_inputs", "takes_position_ids"]

_WIDTHS = (64, 128, 256, 512)
"""Row widths tried beyond the longest input (the cheapest estimated cost wins)."""


class Packed(NamedTuple):
    """A batch laid out in rows: `(rows, width)` int64 arrays, and where each input went."""

    ids: np.ndarray
    segments: np.ndarray
    """Which input of its row a token belongs to, from 1; 0 for padding."""
    positions: np.ndarray
    types: np.ndarray
    row: np.ndarray
    """Per input: its row."""
    start: np.ndarray
    """Per input: its first column."""
    length: np.ndarray
    """Per input: its token count."""


def pack(batch: Sequence[Tokenized], pad_id: int, alpha: float) -> Packed:
    """`batch` packed first-fit by decreasing length into rows of the width that costs
    least: rows x width x (1 + width / alpha), where `alpha` is the model's matmul work per
    token over its attention work per token and per unit of width (2 * hidden +
    intermediate for a BERT-style layer)."""
    lengths = np.fromiter((len(t.ids) for t in batch), dtype=np.int64, count=len(batch))
    longest = int(lengths.max())
    order = np.argsort(-lengths, kind="stable")
    best: tuple[float, int, int, np.ndarray, np.ndarray] | None = None
    for width in sorted({longest, *(w for w in _WIDTHS if w > longest)}):
        rows, start = _first_fit(lengths, order, width)
        count = int(rows.max()) + 1
        cost = count * width * (1 + width / alpha)
        if best is None or cost < best[0]:
            best = (cost, width, count, rows, start)
    assert best is not None
    _, width, count, rows, start = best
    ids = np.full((count, width), pad_id, dtype=np.int64)
    segments = np.zeros((count, width), dtype=np.int64)
    positions = np.zeros((count, width), dtype=np.int64)
    types = np.zeros((count, width), dtype=np.int64)
    for i, tok in enumerate(batch):
        r, s, n = rows[i], start[i], lengths[i]
        ids[r, s : s + n] = tok.ids
        segments[r, s : s + n] = i + 1  # unique in the batch, so unique in its row
        positions[r, s : s + n] = np.arange(n)
        if tok.type_ids is not None:
            types[r, s : s + n] = tok.type_ids
    return Packed(ids, segments, positions, types, rows, start, lengths)


def _first_fit(lengths: np.ndarray, order: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and first column per input, placed longest first into the first row with room."""
    free: list[int] = []
    rows = np.empty(len(lengths), dtype=np.int64)
    start = np.empty(len(lengths), dtype=np.int64)
    for i in order:
        n = int(lengths[i])
        r = next((r for r, room in enumerate(free) if room >= n), len(free))
        if r == len(free):
            free.append(width)
        rows[i], start[i] = r, width - free[r]
        free[r] -= n
    return rows, start


def packed_inputs(packed: Packed, types: bool) -> dict[str, np.ndarray]:
    """What `PackedGraph` takes for `packed` (`types`: whether the model takes token type
    ids), in its argument order: the rows, and where each input's tokens lie in the rows
    flattened (`gather`, `(inputs, longest)`; past an input's end, its first token again,
    so that a max over its row needs no mask) with its mask."""
    longest = int(packed.length.max())
    columns = np.arange(longest)[None, :]
    mask = (columns < packed.length[:, None]).astype(np.int64)
    first = (packed.row * packed.ids.shape[1] + packed.start)[:, None]
    gather = np.where(mask > 0, first + columns, first)
    inputs = {
        "input_ids": packed.ids,
        "segments": packed.segments,
        "position_ids": packed.positions,
        "gather": gather,
        "mask": mask,
    }
    if types:
        inputs["token_type_ids"] = packed.types
    return inputs


class PackedGraph(torch.nn.Module):
    """A model's forward on packed rows, for a graph compiler to trace: `body` (a
    transformers encoder) runs the rows under a block-diagonal mask, its token states are
    gathered back into one padded row per input, and `head(tokens, mask)` makes each
    input's output from them as it would from a padded batch (pooling, a classifier).

    `parts`: the modules `head` (and `per_token`) call, held here so that a tracer takes
    their weights as the graph's (not as constants). `alpha`: the body's matmul work per
    token over its attention work per token and unit of row width (what `pack` weighs
    widths by). `per_token`, if given, maps the token states before they are gathered: a
    head heavy per token (a masked LM's vocabulary projection) then runs on the packed
    tokens, not on each input's padded row."""

    def __init__(
        self,
        body: torch.nn.Module,
        head: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        parts: Sequence[torch.nn.Module],
        alpha: float,
        per_token: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.body = body
        self.head = head
        self.per_token = per_token
        self.parts = torch.nn.ModuleList(parts)
        self.alpha = alpha
        # RoBERTa-family embeddings (XLM-R: multilingual-e5, bge-m3 and their rerankers)
        # number positions from padding_idx + 1; BERT's from 0.
        padding_idx = getattr(getattr(body, "embeddings", None), "padding_idx", None)
        self.first_position = 0 if padding_idx is None else padding_idx + 1

    def forward(
        self,
        input_ids: torch.Tensor,
        segments: torch.Tensor,
        position_ids: torch.Tensor,
        gather: torch.Tensor,
        mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        same = segments.unsqueeze(1).unsqueeze(-1) == segments.unsqueeze(1).unsqueeze(2)
        # Additive, as eager attention adds it and SDPA takes it; a padding token sees the
        # row's other padding, so no row of the mask is empty (an empty one would be NaN).
        bias = torch.where(same, torch.tensor(0.0), torch.tensor(torch.finfo(torch.float32).min))
        features = {
            "input_ids": input_ids,
            "attention_mask": bias,
            "position_ids": position_ids + self.first_position,
        }
        if token_type_ids is not None:
            features["token_type_ids"] = token_type_ids
        hidden = self.body(**features)[0]
        if self.per_token is not None:
            hidden = self.per_token(hidden)
        tokens = hidden.reshape(-1, hidden.shape[-1])[gather]
        return self.head(tokens, mask)


def alpha_of(config) -> float:
    """`PackedGraph.alpha` for a BERT-style layer of `config` (a transformers config):
    4 h^2 + 2 h i multiply-adds per token against 2 h per token and unit of width."""
    hidden = config.hidden_size
    return 2 * hidden + getattr(config, "intermediate_size", 4 * hidden)


def takes_position_ids(body: torch.nn.Module) -> bool:
    """Whether a transformers encoder's forward takes `position_ids` (packing gives each
    input its own)."""
    return "position_ids" in inspect.signature(body.forward).parameters
