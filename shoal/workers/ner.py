"""Token classification logits to entities, in numpy, with transformers' semantics.

The aggregation strategies mean what they mean in transformers'
`TokenClassificationPipeline` (`none`, `simple`, `first`, `max`, `average`), and the
results match it on the same weights (tests/e2e/test_encoder_tasks.py checks labels,
offsets and scores). The per-token work (softmax, argmax, subword detection, grouping of
adjacent tokens or words, group scores) is vectorized; only the entities themselves are
built in Python. A text longer than the model's window is run in overlapping windows, and
overlapping entities are merged as the pipeline does with a `stride`: the longer entity
wins, then the higher score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..queue.messages import Entity

__all__ = ["LabelTable", "Window", "entities_for_text"]

IGNORED = "O"


class LabelTable:
    """Per class index: the B-/I- prefix and the tag, as the pipeline reads label names."""

    def __init__(self, labels: Sequence[str]) -> None:
        self.labels = list(labels)
        tags = []
        begins = []
        for name in labels:
            if name.startswith(("B-", "I-")):
                begins.append(name.startswith("B-"))
                tags.append(name[2:])
            else:
                begins.append(False)
                tags.append(name)
        self.is_begin = np.array(begins, dtype=bool)
        tag_ids = {tag: i for i, tag in enumerate(dict.fromkeys(tags))}
        self.tag_id = np.array([tag_ids[t] for t in tags], dtype=np.int64)
        self.group_label = [name.split("-", 1)[-1] for name in labels]


@dataclass(frozen=True)
class Window:
    """One window's model output and where its tokens are in the text."""

    logits: np.ndarray  # (tokens, classes)
    ids: np.ndarray  # (tokens,)
    offsets: np.ndarray  # (tokens, 2)
    special: np.ndarray  # (tokens,) bool


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def _is_subword(
    text: str,
    ids: np.ndarray,
    offsets: np.ndarray,
    token_lengths: np.ndarray,
    word_aware: bool,
    unk_id: int | None,
) -> np.ndarray:
    starts, ends = offsets[:, 0], offsets[:, 1]
    if word_aware:
        # A subword's token string ("##ing") is longer than the text it covers ("ing").
        sub = token_lengths[ids] != (ends - starts)
    else:
        # The pipeline's fallback: a token not preceded by a space continues a word.
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        is_space = np.append(codes == 32, False)
        before = np.where(starts > 0, is_space[np.maximum(starts - 1, 0)], True)
        sub = (starts > 0) & ~before & ~is_space[np.minimum(starts, len(codes))]
    if unk_id is not None:
        sub &= ids != unk_id
    return sub


def _window_entities(
    text: str,
    window: Window,
    table: LabelTable,
    strategy: str,
    token_lengths: np.ndarray,
    word_aware: bool,
    unk_id: int | None,
) -> list[Entity]:
    keep = ~window.special
    scores = _softmax(window.logits[keep])
    if len(scores) == 0:
        return []
    offsets = window.offsets[keep]
    starts, ends = offsets[:, 0], offsets[:, 1]

    if strategy in ("none", "simple"):
        label = scores.argmax(axis=1)
        score = scores[np.arange(len(scores)), label]
    else:
        ids = window.ids[keep]
        sub = _is_subword(text, ids, offsets, token_lengths, word_aware, unk_id)
        sub[0] = False
        word_starts = np.flatnonzero(~sub)
        word_ends = np.append(word_starts[1:], len(scores)) - 1
        if strategy == "first":
            word_scores = scores[word_starts]
        elif strategy == "max":
            best = scores.max(axis=1)
            group = np.cumsum(~sub) - 1
            # The first token holding its word's highest score (ties: the earliest).
            order = np.lexsort((np.arange(len(best)), -best, group))
            first_of_group = order[np.searchsorted(group[order], np.arange(len(word_starts)))]
            word_scores = scores[first_of_group]
        elif strategy == "average":
            counts = (word_ends - word_starts + 1)[:, None]
            word_scores = np.add.reduceat(scores, word_starts, axis=0) / counts
        else:
            raise ValueError(f"unknown aggregation {strategy!r}")
        label = word_scores.argmax(axis=1)
        score = word_scores[np.arange(len(word_scores)), label]
        starts, ends = starts[word_starts], ends[word_ends]

    if strategy == "none":
        return [
            Entity(label=table.labels[k], start=int(a), end=int(b), score=float(s))
            for k, a, b, s in zip(label, starts, ends, score, strict=True)
            if table.labels[k] != IGNORED
        ]
    tags = table.tag_id[label]
    new = np.ones(len(label), dtype=bool)
    new[1:] = (tags[1:] != tags[:-1]) | table.is_begin[label[1:]]
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(label)) - 1
    means = np.add.reduceat(score, first) / (last - first + 1)
    out = []
    for f, lst, mean in zip(first, last, means, strict=True):
        name = table.group_label[label[f]]
        if name != IGNORED:
            out.append(
                Entity(label=name, start=int(starts[f]), end=int(ends[lst]), score=float(mean))
            )
    return out


def _merge_overlapping(entities: list[Entity]) -> list[Entity]:
    """Entities found by overlapping windows, one per span (the pipeline's rule)."""
    if not entities:
        return entities
    entities = sorted(entities, key=lambda e: e.start)
    merged = []
    previous = entities[0]
    for entity in entities:
        if previous.start <= entity.start < previous.end:
            length, previous_length = entity.end - entity.start, previous.end - previous.start
            if length > previous_length or (
                length == previous_length and entity.score > previous.score
            ):
                previous = entity
        else:
            merged.append(previous)
            previous = entity
    merged.append(previous)
    return merged


def entities_for_text(
    text: str,
    windows: Sequence[Window],
    table: LabelTable,
    strategy: str,
    token_lengths: np.ndarray,
    word_aware: bool,
    unk_id: int | None,
    labels: Sequence[str] = (),
    threshold: float = 0.0,
) -> list[Entity]:
    """The entities in `text`, from its windows' logits, filtered by label and score."""
    found: list[Entity] = []
    for window in windows:
        found.extend(
            _window_entities(text, window, table, strategy, token_lengths, word_aware, unk_id)
        )
    if len(windows) > 1:
        found = _merge_overlapping(found)
    wanted = set(labels)
    return [e for e in found if (not wanted or e.label in wanted) and e.score >= threshold]
