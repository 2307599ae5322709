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
- `int8` and `int4`, opt-in, not exact: the float32 weights re-quantized into llama.cpp's
  blocks of 32 (requantized.py: Q8_0; Q4_1 with the embedding Q8_0), computed in
  float32 as the native tier is. Served when they measure no worse than llama.cpp's own
  Q8_0 (Q4_K_M) of SmolLM2-135M did against its 16-bit model (`PEER_BARS`) and top-1
  reaches `generator.min_weight_agreement`.

A tier that fails its guard falls back one step (`LADDER`: int4, int8, native, float32).

The guard (weight_guard.py): teacher-forced on probe chats against the float32 reference
of the same checkpoint, mean KL divergence and top-1 agreement per answer position. The
log says why a tier failed, with its figures; the engine's name (on `/v1/models` and the
status page) says what serves and how close it measured.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec

from ...config import GeneratorSettings
from ...model_registry import ModelSpec
from .float16_weights import SIXTEEN_BIT
from .openvino_export import export_command, native_ir, openvino_ir
from .requantized import REQUANTIZED, requantized_ir
from .weight_guard import Agreement, agreement, probe_sequences

__all__ = ["NATIVE", "NATIVE_MAX_KL", "NATIVE_MIN_TOP1", "ServedWeights", "served_weights"]

log = logging.getLogger(__name__)

NATIVE_MAX_KL = 1e-3
"""The largest mean KL divergence (nats) from the float32 reference that the checkpoint's
own weights may show (llama-perplexity's `--kl-divergence` measure)."""
NATIVE_MIN_TOP1 = 0.995
"""The least share of positions where they must pick the reference's next token."""
LADDER = ("int4", "int8", "native", "float32")
"""The tiers, narrowest first: one that fails its guard falls back to the next."""
PEER_BARS = {
    "int8": (0.8883, 7.4e-3, "llama.cpp's Q8_0 of SmolLM2-135M on 20k tokens"),
    "int4": (0.6881, 8.7e-2, "llama.cpp's Q4_K_M of SmolLM2-135M on 20k tokens"),
}
"""(least top-1, largest mean KL, whose figures) for the tiers below the checkpoint's
precision: no worse than llama.cpp's own files of the same model, as measured against
their 16-bit reference (perf/results/README.md)."""
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
    profile's tier, guarded: a tier that fails its guard or cannot be built falls back one
    step (`LADDER`), logged with its figures; float32 at the end."""
    full = openvino_ir(path, cache_dir, export_command(settings))
    tier = spec.profile.weights
    probe: list | None = None
    fell_back = False
    for step in LADDER[LADDER.index(tier) : -1]:
        try:
            built = _candidate(step, spec, full, cache_dir)
            if built is None:  # nothing narrower than float32 to serve
                break
            candidate, what, extra, drafted = built
            probe = probe or probe_sequences(tokenizer)
            measured = agreement(full, candidate, probe, properties | extra)
        except Exception as exc:
            log.warning("%s: %s weights not served (%s)", spec.id, step, exc)
            fell_back = True
            continue
        said = f"top-1 {measured.top1:.4f}, mean KL {measured.kl:.1e} nats"
        failed = _failed(step, measured, settings)
        if not failed:
            log.info(
                "%s: serving %s (%s on %d probe positions)", spec.id, what, said, measured.positions
            )
            return ServedWeights(candidate, f"{what} ({said})", extra, drafted)
        log.warning(
            "%s: %s not served (%s on %d probe positions; %s)",
            spec.id, what, said, measured.positions, failed,
        )  # fmt: skip
        fell_back = True
    if fell_back:  # (a float32 checkpoint's own weights are float32: nothing to say)
        log.warning("%s: serving float32 weights", spec.id)
    return ServedWeights(full)


def _candidate(step: str, spec: ModelSpec, full: Path, cache_dir: Path):
    """(IR, what it serves, compile properties, drafted) for `step`, or None where the
    checkpoint holds nothing narrower than float32 (`native` of a float32 checkpoint)."""
    if step in REQUANTIZED:
        what = f"{step} weights: {REQUANTIZED[step]}"
        return requantized_ir(full, step, cache_dir), what, NATIVE, False
    native = native_ir(spec.source, full, cache_dir)
    if native is None:
        return None
    candidate, replaced = native
    origin = "GGUF" if spec.source.startswith("gguf:") else "checkpoint"
    drafted = set(replaced.replaced) <= SIXTEEN_BIT
    return candidate, f"{origin} weights as shipped: {replaced}", NATIVE, drafted


def _failed(tier: str, measured: Agreement, settings: GeneratorSettings) -> str:
    """Why `measured` keeps the tier from serving, or ''."""
    if tier in PEER_BARS:
        top1, kl, peer = PEER_BARS[tier]
        top1 = max(top1, settings.min_weight_agreement)
        if measured.top1 < top1 or measured.kl > kl:
            return f"the guard needs top-1 >= {top1:.4f} and mean KL <= {kl:.1e} ({peer})"
        return ""
    if measured.top1 < NATIVE_MIN_TOP1 or measured.kl > NATIVE_MAX_KL:
        return f"the guard needs top-1 >= {NATIVE_MIN_TOP1} and mean KL <= {NATIVE_MAX_KL}"
    return ""
