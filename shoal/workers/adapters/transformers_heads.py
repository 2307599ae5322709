"""Task heads with plain transformers: token classification (NER), sequence
classification (classify; rerank with a cross-encoder) and masked-LM sparse vectors.

The model loads with `AutoModelForTokenClassification`,
`AutoModelForSequenceClassification` or (sparse) `AutoModelForMaskedLM` from any local
path or hub id, its labels from the config's `id2label`. Outputs are raw logits per row,
or for sparse the SPLADE weights over the vocabulary (pooled in the graph, so the
compiled engine runs it too); turning them into entities, labels, relevance scores or
pruned sparse vectors happens in shoal/workers/encoder/results.py, in numpy. Classify, rerank and
NER batches run packed (`_packing`: the encoder on packed rows, the classifier on each
input's tokens or pooled first token), in the compiled engine or in torch (LoRA
batches), where the load-time check holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import (
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)

from ...model_registry import ModelSpec
from ...queue.messages import ClassifyJob, Job, NerJob, RerankJob, SparseJob
from ..ner import LabelTable
from ._packing import PackedGraph, alpha_of, takes_position_ids
from ._tokenize import FastTokenizer
from ._torch import Graph, TorchAdapter
from .base import Tokenized, pad_batch
from .lora import LoraSlots
from .sentence_transformers import pick_device

__all__ = ["TransformersHeadAdapter"]


class TransformersHeadAdapter(TorchAdapter):
    """NER, rerank and classify heads with plain transformers."""

    ops = frozenset({"ner", "classify", "rerank", "sparse"})

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
        self.model: torch.nn.Module | None = None
        self.tokenizer: FastTokenizer | None = None
        self.labels: list[str] = []
        """Label names by class index, from the model config's `id2label`."""
        self.problem_type: str | None = None
        self.token_lengths: np.ndarray | None = None
        """Per vocabulary id: the length of the token's string (NER word grouping)."""

    def load(self, path: str) -> None:
        hf_tokenizer = AutoTokenizer.from_pretrained(path)
        token_level = "ner" in self.spec.tasks
        auto = (
            AutoModelForMaskedLM
            if "sparse" in self.spec.tasks
            else AutoModelForTokenClassification
            if token_level
            else AutoModelForSequenceClassification
        )
        model = auto.from_pretrained(path).to(self.device).eval()
        self._set_precision(model)
        limit = getattr(hf_tokenizer, "model_max_length", None) or self.spec.max_length
        self._max_length = min(self.spec.max_length, limit)
        self.tokenizer = FastTokenizer(
            hf_tokenizer, self._max_length, stride=self.spec.stride if token_level else 0
        )
        self._token_types = "token_type_ids" in hf_tokenizer.model_input_names
        config = model.config
        self.labels = [config.id2label[i] for i in range(config.num_labels)]
        self.label_table = LabelTable(self.labels)
        self.problem_type = config.problem_type
        if token_level:
            self.token_lengths = np.array([len(t) for t in self.tokenizer.token_strings()])
        self.model = model
        self.lora = LoraSlots(lambda: self.model, self._set_model, self.max_loras)
        example = np.ones((2, 8), dtype=np.int64)
        packed = (
            _packed_splade(model)
            if "sparse" in self.spec.tasks
            else _packed_logits(model, token_level)
        )
        self._compile_graph(
            self._graph(model), self._inputs(example, example, example), packed=packed
        )

    def _graph(self, model: torch.nn.Module) -> Graph:
        """The forward that runs: SPLADE weights for a sparse model, else the logits."""
        return _splade(model) if "sparse" in self.spec.tasks else _logits(model)

    def _set_model(self, model: torch.nn.Module) -> None:
        self.model = model

    def _inputs(
        self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray
    ) -> dict[str, np.ndarray]:
        inputs = {"input_ids": ids, "attention_mask": mask}
        if self._token_types:
            inputs["token_type_ids"] = types
        return inputs

    @property
    def max_length(self) -> int:
        return self._max_length

    def warmup(self) -> None:
        for op in sorted(self.ops & set(self.spec.tasks)):
            common = {
                "request_id": "warmup",
                "part": 0,
                "model": self.spec.id,
                "reply_to": "",
                "deadline": 0,
            }
            job: Job
            if op == "rerank":
                job = RerankJob(**common, query="warm", documents=["up"])
            elif op == "ner":
                job = NerJob(**common, texts=["warm up"])
            elif op == "sparse":
                job = SparseJob(**common, texts=["warm up"])
            else:
                job = ClassifyJob(**common, texts=["warm up"])
            self.forward(op, self.units(job))

    def units(self, job: Job) -> list[Tokenized]:
        assert self.tokenizer is not None
        if isinstance(job, NerJob) and "ner" in self.spec.tasks:
            return self.tokenizer.windows(job.texts)
        if isinstance(job, SparseJob) and "sparse" in self.spec.tasks:
            return self.tokenizer.texts(job.texts)
        if isinstance(job, ClassifyJob) and "classify" in self.spec.tasks:
            return self.tokenizer.texts(job.texts)
        if isinstance(job, RerankJob) and "rerank" in self.spec.tasks:
            return self.tokenizer.pairs(job.query, job.documents, job.doc_tokens)
        raise ValueError(f"model {self.spec.id!r} does not serve {type(job).__name__}")

    def forward(self, op: str, batch: Sequence[Tokenized]) -> Sequence[np.ndarray]:
        assert self.model is not None and self.tokenizer is not None
        if self._runs_packed():  # right-padded: each row's tokens from the first column
            logits = self._run_packed(batch)
            left = False
        else:
            ids, mask, types = pad_batch(batch, self.tokenizer.pad_id, self.tokenizer.pad_left)
            logits = self._run(self._graph(self.model), self._inputs(ids, mask, types))
            left = self.tokenizer.pad_left
        if op != "ner":
            return logits
        width = logits.shape[1]
        return [
            logits[i, width - len(t.ids) :] if left else logits[i, : len(t.ids)]
            for i, t in enumerate(batch)
        ]


def _logits(model: torch.nn.Module) -> Graph:
    return Graph(model, lambda m, features: m(**features).logits)


def _packed_body(model: torch.nn.Module) -> torch.nn.Module | None:
    """The encoder under a transformers head model that a packed forward runs on the rows:
    its base model, where it has one of its own that takes position ids; else None."""
    body = getattr(model, "base_model", None)
    if body is None or body is model or not takes_position_ids(body):
        return None
    return body


def _packed_logits(model: torch.nn.Module, per_token: bool) -> PackedGraph | None:
    """The head's logits on packed rows: the encoder on the rows, then on each input's
    tokens the classifier, per token (`per_token`, NER: zero past the input's end) or on
    the pooled first token (BERT's pooler; a classifier without one, RoBERTa's head, takes
    the tokens itself). None where the model has no such parts or its encoder takes no
    position ids; the load-time check turns packing off where the parts do not add up to
    the model's own forward."""
    body = _packed_body(model)
    if body is None or getattr(model, "classifier", None) is None:
        return None
    pooled = not per_token and getattr(body, "pooler", None) is not None

    def head(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # Looked up at each call: a LoRA adapter (peft) may replace these modules on the
        # model itself (`modules_to_save`: its own trained copy of the classifier).
        classifier = model.classifier
        if per_token:
            return classifier(tokens) * mask.unsqueeze(-1).to(tokens.dtype)
        return classifier(body.pooler(tokens) if pooled else tokens)

    parts = [body.pooler, model.classifier] if pooled else [model.classifier]
    return PackedGraph(body, head, parts, alpha_of(model.config))


def _packed_splade(model: torch.nn.Module) -> PackedGraph | None:
    """SPLADE weights on packed rows: the masked LM's head (`cls`, BERT's; `lm_head`,
    RoBERTa's) and log(1 + relu) on every packed token, before each input's tokens are
    gathered (the vocabulary-wide head costs about as much per token as MiniLM's layers,
    so it runs on the packed tokens, not on padded ones), then each input's max. None where
    the model has no such parts or its encoder takes no position ids."""
    body = _packed_body(model)
    name = next((n for n in ("cls", "lm_head") if getattr(model, n, None) is not None), None)
    if body is None or name is None:
        return None

    def weights(states: torch.Tensor) -> torch.Tensor:
        # Looked up at each call, as the classifiers are (a LoRA may swap the module).
        return _saturated(getattr(model, name)(states))

    def pooled(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # Past an input's end `gather` repeats its first token, which leaves the max as it
        # is: no mask to multiply through a vocabulary-wide copy.
        return tokens.amax(dim=1)

    return PackedGraph(body, pooled, [getattr(model, name)], alpha_of(model.config), weights)


def _splade(model: torch.nn.Module) -> Graph:
    """SPLADE pooling of a masked LM's logits: log(1 + relu(logits)) over the text's tokens
    (padding masked out), max-pooled: one weight per vocabulary id."""

    def weights(m: torch.nn.Module, features: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = m(**features).logits
        mask = features["attention_mask"].unsqueeze(-1).to(logits.dtype)
        return (_saturated(logits) * mask).amax(dim=1)

    return Graph(model, weights)


def _saturated(logits: torch.Tensor) -> torch.Tensor:
    """SPLADE's weight of each vocabulary id at a token: log(1 + relu(logit))."""
    return torch.log1p(torch.relu(logits))
