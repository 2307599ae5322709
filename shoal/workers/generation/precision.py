"""Which weights a generation model serves on OpenVINO, and the guard that lets them.

Exact means exact to the checkpoint as shipped. The tiers (`profile.weights`):
- `native` (the default): the checkpoint's own weights. A GGUF's Q4_0, Q4_1, Q5_x, Q8_0
  and K-quant blocks serve as they are (gguf_weights.py), and 16-bit weights as 16-bit
  (a bf16 or f16 checkpoint, a GGUF's F16 tensors: float16_weights.py), computed in
  float32 with OpenVINO's dynamic quantization of activations off: it is on by default
  for compressed weights, and on SmolLM2's Q4_1 it takes the answers outside the guard
  below (perf/results/README.md). A float32 checkpoint serves its float32 IR.
- `float32`: the dequantized float32 IR, the reference, as every checkpoint was served
  before; a lone greedy stream is drafted by its int8 copy (openvino_host.py).
- `int8`: int8 weights per output channel from the float32 IR, not exact: served when
  top-1 agreement reaches `generator.min_weight_agreement`.

The guard (weight_guard.py): teacher-forced on probe chats against the float32 reference
of the same checkpoint, mean KL divergence and top-1 agreement per answer position. A
tier that fails it falls back to float32; the log says why with its figures, and the
engine's name (on `/v1/models` and the status page) says what serves and how close it
measured.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec

from ...config import GeneratorSettings
from ...model_registry import ModelSpec
from .float16_weights import SIXTEEN_BIT
from .openvino_export import export_command, native_ir, openvino_ir
from .weight_guard import Agreement, agreement, probe_sequences

__all__ = ["NATIVE", "NATIVE_MAX_KL", "NATIVE_MIN_TOP1", "ServedWeights", "served_weights"]

log = logging.getLogger(__name__)

NATIVE_MAX_KL = 1e-3
"""The largest mean KL divergence (nats) from the float32 reference that the checkpoint's
own weights may show (llama-perplexity's `--kl-divergence` measure)."""
NATIVE_MIN_TOP1 = 0.995
"""The least share of positions where they must pick the reference's next token."""
NATIVE = {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
"""Compile properties the checkpoint's own weights serve with (with EXACT's), see above."""


class ServedWeights(msgspec.Struct, frozen=True):
    ir: Path
    """The IR that serves."""
    label: str | None = None
    """What serves in place of the float32 weights, with its guard's figures; None: the
    float32 weights."""
    properties: dict[str, object] = {}
    """Compile properties these weights need beside the runtime's own."""
    drafted: bool = True
    """Whether a lone greedy stream is drafted by the int8 export: it pays where a step
    reads at least twice the draft's bytes (float32 and 16-bit weights), not for a GGUF's
    blocks or int8 weights."""


def served_weights(
    spec: ModelSpec,
    path: str,
    cache_dir: Path,
    settings: GeneratorSettings,
    tokenizer,
    properties: dict[str, object],
) -> ServedWeights:
    """The weights `spec` serves from its transformers directory `path` under its
    profile's tier, guarded; float32 where the tier fails or cannot be built (logged).
    `properties`: the runtime's compile properties (threads, precision)."""
    full = openvino_ir(path, cache_dir, export_command(settings))
    tier = spec.profile.weights
    if tier == "float32":
        return ServedWeights(full)
    try:
        if tier == "int8":
            candidate = openvino_ir(path, cache_dir, export_command(settings), "int8")
            what, extra, drafted = "int8 weights", {}, False
        else:
            native = native_ir(spec.source, full, cache_dir)
            if native is None:  # nothing narrower than float32 to serve
                return ServedWeights(full)
            candidate, replaced = native
            origin = "GGUF" if spec.source.startswith("gguf:") else "checkpoint"
            what, extra = f"{origin} weights as shipped: {replaced}", NATIVE
            drafted = set(replaced.replaced) <= SIXTEEN_BIT
        probe = probe_sequences(tokenizer)
        measured = agreement(full, candidate, probe, properties | extra)
    except Exception as exc:
        log.warning("%s: %s weights not served (%s): serving float32", spec.id, tier, exc)
        return ServedWeights(full)
    said = f"top-1 {measured.top1:.4f}, mean KL {measured.kl:.1e} nats"
    failed = _failed(tier, measured, settings)
    if failed:
        log.warning(
            "%s: %s not served (%s on %d probe positions; %s): serving float32",
            spec.id, what, said, measured.positions, failed,
        )  # fmt: skip
        return ServedWeights(full)
    log.info("%s: serving %s (%s on %d probe positions)", spec.id, what, said, measured.positions)
    return ServedWeights(candidate, f"{what} ({said})", extra, drafted)


def _failed(tier: str, measured: Agreement, settings: GeneratorSettings) -> str:
    """Why `measured` keeps the tier from serving, or ''."""
    if tier == "int8":
        floor = settings.min_weight_agreement
        return f"top-1 below {floor:.3f}" if measured.top1 < floor else ""
    if measured.top1 < NATIVE_MIN_TOP1 or measured.kl > NATIVE_MAX_KL:
        return f"the guard needs top-1 >= {NATIVE_MIN_TOP1} and mean KL <= {NATIVE_MAX_KL}"
    return ""
