"""Embeddings and token vectors with any sentence-transformers model, batched by Shoal.

sentence-transformers loads the model and its module graph (transformer, pooling, dense,
normalize) from the model's own config, so every model it supports pools as its authors
meant. Shoal does the rest: it tokenizes with the fast tokenizer directly (in a thread,
overlapping the forward pass) and, for `embed` on a CPU, packs each batch: the texts end
to end in rows, no padding between them (see `_packing`), through the transformer and
then the model's own modules after it, under `torch.inference_mode` (LoRA batches too)
or compiled by OpenVINO (see `_openvino`; the default `auto` engine where its check
passes, or `engine = "openvino"`). `multivector` batches pack too, in torch. On a GPU
each length-sorted batch is padded to its own longest row.

`multivector` returns the transformer's token vectors (before pooling), through an
optional ColBERT-style linear projection stored in the model directory.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from ...model_registry import ModelSpec
from ...queue.messages import EmbedJob, Job, MultiVectorJob
from ._packing import PackedGraph, alpha_of, takes_position_ids
from ._tokenize import FastTokenizer
from ._torch import Graph, TorchAdapter
from .base import Tokenized, pad_batch
from .lora import LoraSlots

__all__ = ["SentenceTransformerAdapter", "pick_device"]

_PUNCTUATION = frozenset(string.punctuation)


def pick_device(setting: str) -> str:
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return setting


class SentenceTransformerAdapter(TorchAdapter):
    """Embeddings and multi-vector outputs of a sentence-transformers model."""

    ops = frozenset({"embed", "multivector"})

    def __init__(
        self,
        spec: ModelSpec,
        device: str = "auto",
        max_loras: int = 8,
        cache_dir: Path | None = None,
    ) -> None:
        super().__init__(spec)
        self.cache_dir = cache_dir
        self.device = pick_device(device)
        self.max_loras = max_loras
        self.model: SentenceTransformer | None = None
        self.tokenizer: FastTokenizer | None = None
        self._projection: torch.nn.Linear | None = None
        self.punctuation: np.ndarray | None = None
        """Per vocabulary id: whether the token is punctuation only (for multivector)."""
        self._packed_tokens: PackedGraph | None = None
        """Token vectors on packed rows, in torch, where they matched padded ones at load."""

    def load(self, path: str) -> None:
        model = SentenceTransformer(path, device=self.device)
        model.eval()
        self._set_precision(model)
        # LoRA adapters go on the transformer module (sentence-transformers 6 keeps it in
        # `.model`; older releases in `.auto_model`).
        first = model[0]
        attr = _transformer_attr(first)
        self.lora = LoraSlots(
            lambda: getattr(first, attr), lambda m: setattr(first, attr, m), self.max_loras
        )
        self._max_length = min(self.spec.max_length, model.max_seq_length or self.spec.max_length)
        self.tokenizer = FastTokenizer(model.tokenizer, self._max_length)
        self._token_types = "token_type_ids" in model.tokenizer.model_input_names
        self.model = model
        # sentence-transformers 6 renamed this method; older releases have only the old name.
        dims_of = getattr(model, "get_embedding_dimension", None)
        dims = dims_of() if dims_of else model.get_sentence_embedding_dimension()
        if "embed" in self.spec.tasks and dims != self.spec.dims:
            raise ValueError(
                f"model {self.spec.id!r} gives {dims} dims, its spec says {self.spec.dims}"
            )
        example = self._inputs(np.ones((2, 8), dtype=np.int64))
        if "multivector" in self.spec.tasks:
            self._load_multivector(Path(path))
            packed = _packed_token_vectors(model, self._projection)
            tokens = _token_vectors(model, self._projection)
            holds = packed is not None and self._torch_packs(packed, tokens, list(example))
            self._packed_tokens = packed if holds else None
        if "embed" in self.spec.tasks:
            self._compile_graph(_pooled(model), example, packed=_packed(model))

    def _load_multivector(self, path: Path) -> None:
        from safetensors.torch import load_file

        options = self.spec.multivector
        if options.projection:
            weights = load_file(str(path / options.projection))
            weight = weights["weight"]
            layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in weights)
            layer.load_state_dict(weights)
            self._projection = layer.to(self.device).eval()
        assert self.tokenizer is not None
        tokens = self.tokenizer.token_strings()
        self.punctuation = np.array(
            [bool(t) and all(c in _PUNCTUATION for c in t) for t in tokens], dtype=bool
        )

    def _compiles(self) -> bool:
        return "embed" in self.spec.tasks  # multi-vector runs in torch

    @property
    def max_length(self) -> int:
        return self._max_length

    def warmup(self) -> None:
        for op in sorted(self.ops & set(self.spec.tasks)):
            job = (EmbedJob if op == "embed" else MultiVectorJob)(
                request_id="warmup",
                part=0,
                model=self.spec.id,
                reply_to="",
                deadline=0,
                texts=["warm up"],
            )
            self.forward(op, self.units(job))

    def units(self, job: Job) -> list[Tokenized]:
        assert self.tokenizer is not None
        if isinstance(job, EmbedJob):
            if job.token_ids:
                return self.tokenizer.ids(job.token_ids)
            return self.tokenizer.texts(job.texts)
        if isinstance(job, MultiVectorJob):
            return self.tokenizer.texts(job.texts, detail=True)
        raise ValueError(f"model {self.spec.id!r} does not serve {type(job).__name__}")

    def _inputs(self, ids: np.ndarray, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
        inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids) if mask is None else mask}
        if self._token_types:
            inputs["token_type_ids"] = np.zeros_like(ids)
        return inputs

    def _on_engine(self, op: str) -> bool:
        return op == "embed"  # token vectors (multivector) come from the torch model

    def forward(self, op: str, batch: Sequence[Tokenized]) -> Sequence[np.ndarray]:
        assert self.model is not None and self.tokenizer is not None
        if op == "embed" and self._runs_packed():
            return self._run_packed(batch)
        if op == "multivector" and self._packed_tokens is not None:
            packed = self._packed_inputs(batch, self._packed_tokens)
            with self._compute():
                tokens = self._torch_forward(self._packed_tokens, packed)
            return [tokens[i, : len(tok.ids)] for i, tok in enumerate(batch)]
        ids, mask, _ = pad_batch(batch, self.tokenizer.pad_id, self.tokenizer.pad_left)
        inputs = self._inputs(ids, mask)
        if op == "embed":
            return self._run(_pooled(self.model), inputs)
        with self._compute():
            tokens = self._torch_forward(_token_vectors(self.model, self._projection), inputs)
        width = ids.shape[1]
        rows = []
        for i, tok in enumerate(batch):
            n = len(tok.ids)
            rows.append(tokens[i, width - n :] if self.tokenizer.pad_left else tokens[i, :n])
        return rows


def _pooled(model: SentenceTransformer) -> Graph:
    """The model's pooled embedding (its own pooling, dense and normalize modules)."""
    return Graph(model, lambda m, features: m(features)["sentence_embedding"])


def _token_vectors(model: SentenceTransformer, projection: torch.nn.Module | None) -> Graph:
    """The transformer's token vectors, through the multi-vector projection if any."""

    def tokens(m: SentenceTransformer, features: dict[str, torch.Tensor]) -> torch.Tensor:
        vectors = m(features)["token_embeddings"]
        return projection(vectors) if projection is not None else vectors

    return Graph(model, tokens)


def _transformer_attr(first: torch.nn.Module) -> str:
    """Where the first module keeps its transformers model: sentence-transformers 6 keeps
    it in `.model`; older releases in `.auto_model`."""
    renamed = isinstance(getattr(type(first), "auto_model", None), property)
    return "model" if renamed else "auto_model"


def _packed_body(model: SentenceTransformer) -> torch.nn.Module | None:
    """The transformers model a packed forward runs on the rows: the first module's, where
    it is one and takes position ids; else None (packing is off)."""
    first = model[0]
    body = getattr(first, _transformer_attr(first), None)
    if not isinstance(body, torch.nn.Module) or not hasattr(body, "config"):
        return None
    return body if takes_position_ids(body) else None


def _packed(model: SentenceTransformer) -> PackedGraph | None:
    """The pooled embedding on packed rows: the transformers model on the rows, then the
    model's own modules after it (pooling, dense, normalize) on each input's tokens."""
    body, rest = _packed_body(model), list(model)[1:]
    if body is None:
        return None

    def pooled(vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        features = {"token_embeddings": vectors, "attention_mask": mask}
        for module in rest:
            features = module(features)
        return features["sentence_embedding"]

    return PackedGraph(body, pooled, rest, alpha_of(body.config))


def _packed_token_vectors(
    model: SentenceTransformer, projection: torch.nn.Module | None
) -> PackedGraph | None:
    """Each input's token vectors on packed rows, through `projection` if any, zero past
    the input's end."""
    body = _packed_body(model)
    if body is None:
        return None

    def token_vectors(vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if projection is not None:
            vectors = projection(vectors)
        return vectors * mask.unsqueeze(-1).to(vectors.dtype)

    parts = [] if projection is None else [projection]
    return PackedGraph(body, token_vectors, parts, alpha_of(body.config))
