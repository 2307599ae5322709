"""The tiers below the checkpoint's own precision: its weights re-quantized into blocks.

`weights = "int8"` and `weights = "int4"` are opt-in and guarded (precision.py). Each
weight of the float32 IR (the checkpoint's values) is quantized, per row, into llama.cpp's
blocks of 32 with gguf-py, the library llama.cpp's own conversion uses, and served by the
same kernels as a GGUF's blocks (gguf_weights.py), in float32 arithmetic:

- `int8`: Q8_0, w = d * q with q signed 8-bit and an f16 scale per 32 weights;
- `int4`: Q4_1, w = d * q + m with q 4-bit and an f16 scale and minimum per 32, and Q8_0
  for the token embedding (with a tied output head, the largest matmul), as llama.cpp's
  4-bit mixes keep it wider.

Built once from the float32 IR and cached beside it. A weight whose rows are not whole
blocks (a width that is not a multiple of 32) stays float32, and the log says so.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np

from ...model_registry.cache_dirs import is_complete, one_builder, partial_dir, publish
from .float16_weights import weight_constants
from .gguf_blocks import blocks
from .gguf_weights import serve_blocks
from .openvino_export import save_rebuilt

__all__ = ["REQUANTIZED", "requantized_ir"]

log = logging.getLogger(__name__)

REQUANTIZED = {"int8": "Q8_0 blocks", "int4": "Q4_1 blocks, embedding Q8_0"}
"""The tiers this module builds, and what each serves (as the engine's name says)."""
_VERSION = "1"  # bump when the graph built differs
_BLOCK = 32  # weights per block, for every type used here
_EMBEDDING = "model.embed_tokens.weight"


def requantized_ir(full: Path, tier: str, cache_dir: Path) -> Path:
    """The float32 IR `full` with its weights in `tier`'s blocks (built on first use, then
    read from the cache)."""
    import openvino as ov

    stamp = f"{full.name}|{tier}|{_VERSION}"
    target = cache_dir / "openvino" / hashlib.sha256(stamp.encode()).hexdigest()[:20]
    with one_builder(target):
        if is_complete(target):
            return target
        model = ov.Core().read_model(str(full / "openvino_model.xml"))
        counts = requantize(model, tier)
        log.info("%s weights, once: %s", tier, ", ".join(f"{k} x{n}" for k, n in counts.items()))
        partial = partial_dir(target)
        partial.mkdir()
        save_rebuilt(model, full, partial)
        return publish(partial, target)


def requantize(model, tier: str) -> dict[str, int]:
    """Replace, in the OpenVINO `model`, each float32 weight constant by `tier`'s blocks of
    its values; how many weights took each block type ("float32": left as they were)."""
    import gguf
    import openvino as ov

    if tier not in REQUANTIZED:
        raise ValueError(f"no re-quantized tier {tier!r}: one of {', '.join(REQUANTIZED)}")
    counts: dict[str, int] = {}
    for const in list(weight_constants(model)):
        if const.get_element_type() != ov.Type.f32:
            continue
        weight = const.get_data()
        kind = (
            "Q4_1"
            if tier == "int4" and const.get_friendly_name() != f"self.{_EMBEDDING}"
            else "Q8_0"
        )
        if weight.shape[1] % _BLOCK:
            kind = "float32"
            log.warning("%s: rows of %d are not whole blocks of %d; it stays float32",
                        const.get_friendly_name(), weight.shape[1], _BLOCK)  # fmt: skip
        else:
            raw = gguf.quants.quantize(
                np.ascontiguousarray(weight), gguf.GGMLQuantizationType[kind]
            )
            serve_blocks(const, *blocks(raw, kind), kind, weight.shape)
        counts[kind] = counts.get(kind, 0) + 1
    return counts
