"""A model's fast tokenizer, configured the way Shoal batches: no padding (each batch is
padded to its own longest row), truncation to the spec's max length, character offsets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tokenizers import Encoding, Tokenizer

from ..tokens import plain_tokenizer
from .base import Tokenized

__all__ = ["FastTokenizer"]


class FastTokenizer:
    def __init__(self, hf_tokenizer, max_length: int, stride: int = 0) -> None:
        if not getattr(hf_tokenizer, "is_fast", False):
            raise ValueError("Shoal needs a fast (Rust) tokenizer for this model")
        config = hf_tokenizer.backend_tokenizer.to_str()
        # Many tokenizer.json files pad and truncate to fixed lengths: undo both.
        self._plain = Tokenizer.from_str(config)
        self._plain.no_padding()
        self._plain.enable_truncation(max_length)
        self._windows: Tokenizer | None = None
        if stride:
            self._windows = Tokenizer.from_str(config)
            self._windows.no_padding()
            self._windows.enable_truncation(max_length, stride=stride)
        self.max_length = max_length
        self.pad_id = hf_tokenizer.pad_token_id or 0
        self.pad_left = hf_tokenizer.padding_side == "left"
        self.vocab_size = self._plain.get_vocab_size()
        self._specials = self._plain.num_special_tokens_to_add(False)
        self._pair_specials = self._plain.num_special_tokens_to_add(True)
        self._prefix, self._suffix = _special_affixes(self._plain)
        self.continuing_subword_prefix = getattr(
            self._plain.model, "continuing_subword_prefix", None
        )
        self.unk_id = hf_tokenizer.unk_token_id
        self._whole: Tokenizer | None = None

    @property
    def whole(self) -> Tokenizer:
        """The tokenizer as the model ships it, uncut (what a tokenize request is told)."""
        if self._whole is None:
            self._whole = plain_tokenizer(self._plain)
        return self._whole

    def texts(self, texts: Sequence[str], detail: bool = False) -> list[Tokenized]:
        """One row per text, cut to max length; `detail` adds offsets and special masks."""
        encodings = self._plain.encode_batch(list(texts), add_special_tokens=True)
        return [self._row(enc, self._specials, detail) for enc in encodings]

    def windows(self, texts: Sequence[str]) -> list[Tokenized]:
        """Every text in overlapping windows of max length (one row each, `source` = the
        text's position), with character offsets into the original text."""
        assert self._windows is not None, "windows need a stride"
        rows: list[Tokenized] = []
        for source, enc in enumerate(self._windows.encode_batch(list(texts))):
            for piece in (enc, *enc.overflowing):
                row = self._row(piece, self._specials, detail=True)
                row.full_length = len(row.ids)
                row.source = source
                rows.append(row)
        return rows

    def pairs(self, first: str, seconds: Sequence[str], second_tokens: int = 0) -> list[Tokenized]:
        """`(first, second)` sentence pairs, cut longest-first to max length; with
        `second_tokens`, each second text is first cut to that many tokens (at the end of
        its last whole token, by character offsets)."""
        if second_tokens:
            seconds = [
                s[: enc.offsets[second_tokens - 1][1]] if len(enc.ids) > second_tokens else s
                for s, enc in zip(
                    seconds,
                    self._plain.encode_batch(list(seconds), add_special_tokens=False),
                    strict=True,
                )
            ]
        encodings = self._plain.encode_batch([(first, s) for s in seconds])
        return [self._row(enc, self._pair_specials, detail=False, types=True) for enc in encodings]

    def ids(self, token_ids: Sequence[Sequence[int]]) -> list[Tokenized]:
        """Caller-tokenized inputs, special tokens added, cut to max length.

        Raises:
            ValueError: an id outside the vocabulary.
        """
        room = self.max_length - len(self._prefix) - len(self._suffix)
        rows = []
        for ids in token_ids:
            if any(not 0 <= i < self.vocab_size for i in ids):
                raise ValueError(f"token ids must be in [0, {self.vocab_size}) for this model")
            kept = [*self._prefix, *ids[:room], *self._suffix]
            rows.append(Tokenized(np.asarray(kept, dtype=np.int64), len(ids) + self._specials))
        return rows

    def token_strings(self) -> list[str]:
        """Every vocabulary entry by id (for tables precomputed over the vocabulary)."""
        return [self._plain.id_to_token(i) or "" for i in range(self.vocab_size)]

    @staticmethod
    def _row(enc: Encoding, specials: int, detail: bool, types: bool = False) -> Tokenized:
        ids = np.asarray(enc.ids, dtype=np.int64)
        full = len(ids) + sum(len(piece.ids) - specials for piece in enc.overflowing)
        return Tokenized(
            ids,
            full,
            type_ids=np.asarray(enc.type_ids, dtype=np.int64) if types else None,
            offsets=np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2) if detail else None,
            special=np.asarray(enc.special_tokens_mask, dtype=bool) if detail else None,
        )


def _special_affixes(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the post-processor puts before and after one sequence."""
    enc = tokenizer.encode("a", add_special_tokens=True)
    mask = enc.special_tokens_mask
    if 0 not in mask:
        return list(enc.ids), []
    first = mask.index(0)
    last = len(mask) - mask[::-1].index(0)
    return enc.ids[:first], enc.ids[last:]
