"""Embeddings with any sentence-transformers model, batched by Shoal rather than `encode`.

sentence-transformers loads the model and its module graph (transformer, pooling, dense,
normalize) from the model's own config, so every model it supports pools as its authors
meant. Shoal does the rest: it tokenizes with the fast tokenizer directly (in a thread,
overlapping the forward pass), pads each length-sorted batch to its own longest row,
and calls the module graph under `torch.inference_mode`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from tokenizers import Tokenizer

from ...model_registry import ModelSpec, resolve_source
from .base import EncoderAdapter, Tokenized

__all__ = ["SentenceTransformerAdapter", "pick_device"]


def pick_device(setting: str) -> str:
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return setting


class SentenceTransformerAdapter(EncoderAdapter):
    def __init__(self, spec: ModelSpec, device: str = "auto") -> None:
        super().__init__(spec)
        self.device = pick_device(device)
        self.model: SentenceTransformer | None = None
        self._tokenizer: Tokenizer | None = None

    def load(self) -> None:
        model = SentenceTransformer(resolve_source(self.spec), device=self.device)
        model.eval()
        hf_tokenizer = model.tokenizer
        # The tokenizer.json of many models pads and truncates to fixed lengths; Shoal
        # wants neither: it pads per batch and truncates to the spec's max length.
        tokenizer = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
        tokenizer.no_padding()
        self._max_length = min(self.spec.max_length, model.max_seq_length or self.spec.max_length)
        tokenizer.enable_truncation(self._max_length)
        self._tokenizer = tokenizer
        self._specials = tokenizer.num_special_tokens_to_add(False)
        self._prefix, self._suffix = _special_affixes(tokenizer)
        self._pad_id = hf_tokenizer.pad_token_id or 0
        self._pad_left = hf_tokenizer.padding_side == "left"
        self._token_types = "token_type_ids" in hf_tokenizer.model_input_names
        self._vocab = tokenizer.get_vocab_size()
        self.model = model
        # sentence-transformers 6 renamed this method; older releases have only the old name.
        dims_of = getattr(model, "get_embedding_dimension", None)
        dims = dims_of() if dims_of else model.get_sentence_embedding_dimension()
        if dims != self.spec.dims:
            raise ValueError(
                f"model {self.spec.id!r} gives {dims} dims, its spec says {self.spec.dims}"
            )

    @property
    def max_length(self) -> int:
        return self._max_length

    def tokenize(self, texts: Sequence[str]) -> list[Tokenized]:
        assert self._tokenizer is not None
        out = []
        for enc in self._tokenizer.encode_batch(list(texts), add_special_tokens=True):
            ids = np.asarray(enc.ids, dtype=np.int64)
            full = len(ids)
            for piece in enc.overflowing:
                full += len(piece.ids) - self._specials
            out.append(Tokenized(ids, full))
        return out

    def prepare_ids(self, token_ids: Sequence[Sequence[int]]) -> list[Tokenized]:
        room = self._max_length - len(self._prefix) - len(self._suffix)
        out = []
        for ids in token_ids:
            if any(not 0 <= i < self._vocab for i in ids):
                raise ValueError(f"token ids must be in [0, {self._vocab}) for this model")
            kept = [*self._prefix, *ids[:room], *self._suffix]
            out.append(Tokenized(np.asarray(kept, dtype=np.int64), len(ids) + self._specials))
        return out

    def embed(self, batch: Sequence[Tokenized]) -> np.ndarray:
        assert self.model is not None
        rows = len(batch)
        width = max(len(t.ids) for t in batch)
        ids = np.full((rows, width), self._pad_id, dtype=np.int64)
        mask = np.zeros((rows, width), dtype=np.int64)
        for i, tok in enumerate(batch):
            n = len(tok.ids)
            span = slice(width - n, width) if self._pad_left else slice(0, n)
            ids[i, span] = tok.ids
            mask[i, span] = 1
        features = {
            "input_ids": torch.from_numpy(ids).to(self.device),
            "attention_mask": torch.from_numpy(mask).to(self.device),
        }
        if self._token_types:
            features["token_type_ids"] = torch.zeros_like(features["input_ids"])
        with torch.inference_mode():
            out = self.model(features)["sentence_embedding"]
        return out.float().cpu().numpy()

    def unload(self) -> None:
        self.model = None
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()


def _special_affixes(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the post-processor puts before and after one sequence."""
    enc = tokenizer.encode("a", add_special_tokens=True)
    mask = enc.special_tokens_mask
    first = mask.index(0) if 0 in mask else len(mask)
    last = len(mask) - mask[::-1].index(0) if 0 in mask else len(mask)
    return enc.ids[:first], enc.ids[last:]
