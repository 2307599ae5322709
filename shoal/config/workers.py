"""What encoder and generation workers serve, and how."""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated

import msgspec

__all__ = ["GeneratorSettings", "WorkerSettings"]


class WorkerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What an encoder worker serves, on which device, within which memory."""

    models: list[str] = msgspec.field(default_factory=lambda: ["*"])
    """Model ids this worker serves; `*` serves every model in the registry, including
    those registered later through the admin API."""
    pinned: list[str] = msgspec.field(default_factory=lambda: ["all-MiniLM-L6-v2"])
    """Models loaded at start and never evicted (those this worker serves). Others load
    on their first request and are evicted least recently used."""
    memory_budget: int = 0
    """Bytes of model weights this worker keeps resident; 0: 70% of the memory available
    at start (GPU memory on a CUDA device)."""
    max_adapters_per_model: int = 8
    """LoRA adapters kept loaded per base model; more are evicted least recently used."""
    device: str = "auto"
    """`auto` (CUDA when present), `cpu`, `cuda`, `cuda:1`, ..."""
    threads: int = 0
    """torch intra-op threads; 0 leaves torch's default (one per core)."""
    max_held_jobs: int = 64
    """Most work items one worker holds (pulled, not yet acked); the rest stay queued."""
    batch_slice_ms: float = 10.0
    """While live traffic is about, batch-lane forward passes are cut to take about this
    long (and run on half the CPU threads), so live requests wait little behind them."""
    heartbeat_interval: float = 1.0
    """Seconds between a worker's heartbeats (what it serves, its load), which gateways
    and the status page read; `gateway.worker_ttl` after the last one it counts as gone."""

    def serves(self, model: str, tasks: Collection[str]) -> bool:
        """Whether an encoder worker serves the model `model` with `tasks`."""
        return "generate" not in tasks and ("*" in self.models or model in self.models)


class GeneratorSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a generation worker serves and with which runtime."""

    models: list[str] = msgspec.field(default_factory=lambda: ["*"])
    """Generation models this worker serves; `*` serves every model with the `generate`
    task in the spec files."""
    device: str = "auto"
    """`auto` (CUDA when present), `cpu`, `cuda`, `cuda:1`, ... for the transformers and
    OpenVINO runtimes; an SGLang server is not told it (`CUDA_VISIBLE_DEVICES` is)."""
    max_running: int = 0
    """Sequences generated at once (the continuous batch); 0: the model profile's
    `max_batch_items`."""
    sglang_command: list[str] = msgspec.field(
        default_factory=lambda: ["python", "-m", "sglang.launch_server"]
    )
    """How to start an SGLang server (its own environment's Python), for `sglang` models."""
    sglang_args: list[str] = msgspec.field(default_factory=list)
    """Extra flags for the SGLang server (e.g. `--mem-fraction-static 0.8`)."""
    sglang_start_timeout: float = 600.0
    """Seconds an SGLang server may take to start (load and capture) before the worker
    gives up on it."""
    openvino_export_command: list[str] = []
    """How to run `optimum-cli` for the OpenVINO runtime's one-time export of a model;
    empty: one beside this Python, else the `.venv-export` beside this venv (`make
    setup` builds it: optimum-intel pins an older transformers than Shoal's)."""
    min_weight_agreement: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.9
    """The least share of probe positions where a model in a tier below its checkpoint's
    precision (`weights = "int8"` or `"int4"`) must pick the same next token as the
    float32 one to be served so, beside the tier's bar from llama.cpp's figures
    (precision.py; SmolLM2-135M's agreement per tier: perf/results/README.md)."""
    openvino_draft_tokens: Annotated[int, msgspec.Meta(ge=0, le=16)] = 4
    """Speculative decoding of a lone greedy sequence on the OpenVINO runtime: the
    model's int8 copy drafts this many tokens and the full model checks them in one
    pass, keeping the ones it would have picked itself (the answer is the full model's;
    its gain on one stream is in perf/results/README.md). Only while that sequence is the
    only one. Its pipeline stays loaded (about 1 GB more): 0 (off) saves the memory on a
    worker that is always busy."""
    openvino_cache_gb: float = 1.0
    """The OpenVINO runtime's KV cache per model, in GB (paged: shared by every running
    sequence)."""

    def serves(self, model: str, tasks: Collection[str]) -> bool:
        """Whether a generation worker serves the model `model` with `tasks`."""
        return "generate" in tasks and ("*" in self.models or model in self.models)
