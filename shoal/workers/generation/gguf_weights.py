"""A GGUF's quantized blocks as the OpenVINO model's weights: the checkpoint as shipped.

The model's OpenVINO IR is exported (optimum) from the float32 copy of the GGUF (gguf.py
dequantizes it). That copy is the reference, and serving it reads ~6x the bytes the file
holds: SmolLM2-135M's Q4_1 blocks are 85 MB, its float32 copy 540 MB, and one decode
step reads every weight. This module puts the file's own blocks back: each weight the
GGUF stores quantized becomes its codes (4 or 8 bits), with the file's f16 scale (and
minimum) per block of 32, decompressed inside the matmul. OpenVINO's CPU plugin fuses
the Convert, Subtract, Multiply chain into its FullyConnected (and Gather) kernels, so a
step reads the 4-bit codes, not a widened copy.

Each block type (`gguf_blocks`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) is, per
group of weights, its integer codes, a scale and a float zero point, exactly the file's
values. Other tensor types (Q2_K, Q3_K, the i-quants; F16, F32) keep the exported float32
constant here; float16_weights.py then puts F16 and BF16 tensors back in 16 bits.

Every replaced weight is checked against the exported constant (gguf-py's dequantizing
of the same bytes): where they differ by more than float32 rounding (a layout this
module does not know), that weight keeps its float32 constant and the log says so.
Names map with gguf-py's own tensor-name table; llama-style Q and K rows, which the GGUF
stores permuted for its rotary layout, are put back the way transformers reads them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
import numpy as np

from .float16_weights import weight_constants
from .gguf_blocks import BLOCK_TYPES, FOUR_BIT_TYPES, SIGNED_TYPES, blocks

__all__ = ["NativeWeights", "native_weights", "serve_blocks"]

log = logging.getLogger(__name__)

_FLOAT_TYPES = {"F32", "F16", "BF16"}  # float tensors: served as exported
_TOLERANCE = 1e-6  # of the tensor's largest |w|: float32 rounding, far below a 4-bit step


class NativeWeights(msgspec.Struct):
    """What `native_weights` did: how many weights of each GGUF type it replaced, and
    which stayed float32 (and why)."""

    replaced: dict[str, int] = {}
    kept: dict[str, str] = {}

    def __str__(self) -> str:
        types = ", ".join(f"{t} x{n}" for t, n in sorted(self.replaced.items()))
        return f"{types}, {len(self.kept)} float32" if self.kept else types


def native_weights(model, gguf_path: Path) -> NativeWeights:
    """Replace, in the OpenVINO `model` (optimum's export of the dequantized GGUF), every
    weight constant the GGUF at `gguf_path` stores in one of `BLOCK_TYPES` by its blocks."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    arch = _field(reader, "general.architecture")
    layers = int(_field(reader, f"{arch}.block_count"))
    heads = {int(_field(reader, f"{arch}.attention.head_count"))}
    kv_heads = _field(reader, f"{arch}.attention.head_count_kv")
    if kv_heads is not None:
        heads.add(int(kv_heads))
    names = gguf.get_tensor_name_map(_arch(gguf, arch), layers)
    tensors = {t.name: t for t in reader.tensors}
    done = NativeWeights()
    for const in weight_constants(model):
        hf_name = const.get_friendly_name().removeprefix("self.").removesuffix(".weight")
        gguf_name = names.get_name(hf_name)
        tensor = tensors.get(f"{gguf_name}.weight") if gguf_name else None
        if tensor is None:
            continue
        kind = tensor.tensor_type.name
        if kind not in BLOCK_TYPES:
            if kind not in _FLOAT_TYPES:  # Q2_K, Q3_K, i-quants: not expressed here yet
                done.kept[hf_name] = f"{kind} blocks are not served as blocks yet"
            continue
        exported = const.get_data()
        raw = np.asarray(tensor.data).reshape(exported.shape[0], -1)
        grouped = _matching_blocks(raw, kind, exported, heads)
        if grouped is None:
            done.kept[hf_name] = f"{kind} blocks do not match the exported weights"
            continue
        serve_blocks(const, *grouped, kind, exported.shape)
        done.replaced[kind] = done.replaced.get(kind, 0) + 1
    for name, why in done.kept.items():
        log.warning("%s: %s; it stays float32", name, why)
    return done


def _field(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.parts[field.data[0]]
    return bytes(value).decode() if field.types[0].name == "STRING" else value[0]


def _arch(gguf, name: str):
    for arch, arch_name in gguf.MODEL_ARCH_NAMES.items():
        if arch_name == name:
            return arch
    raise ValueError(f"gguf-py does not know the architecture {name!r}")


def _matching_blocks(raw: np.ndarray, kind: str, exported: np.ndarray, heads: set[int]):
    """The blocks (`gguf_blocks.blocks`) with the GGUF rows in the exported constant's order (the
    file's, or the llama Q/K layout put back for one of `heads`), or None when neither
    gives the same weights."""
    n = raw.shape[0]
    candidates = [np.arange(n)]
    for h in sorted(heads):
        if n % (2 * h) == 0:  # transformers' reverse_permute_weights, on row numbers
            candidates.append(np.arange(n).reshape(h, n // h // 2, 2).swapaxes(2, 1).reshape(n))
    limit = _TOLERANCE * max(float(np.abs(exported).max()), 1e-30)
    for rows in candidates:
        codes, scale, zero = blocks(raw[rows], kind)
        served = ((codes.astype(np.float32) - zero) * scale).reshape(exported.shape)
        if np.abs(served - exported).max() <= limit:
            return codes, scale, zero
    return None


def serve_blocks(const, codes, scale, zero, kind: str, shape: tuple[int, ...]) -> None:
    """Feed every reader of the weight constant `const` from the blocks (codes, scale,
    zero point per group) of a `kind` weight of `shape`, decompressed in its kernel.

    (Adding Q4_1's minimum apart, as a matmul on x's group sums, so the kernel reads
    codes with no zero point, measured no faster with dynamic quantization off: -2% to
    +10% at one row, +10-17% at eight; perf/results/README.md.)"""
    node = _decompressed(codes, scale, zero, kind, shape, const.get_friendly_name())
    for target in list(const.output(0).get_target_inputs()):
        target.replace_source_output(node)


def _decompressed(
    codes: np.ndarray,
    scale: np.ndarray,
    zero: np.ndarray,
    kind: str,
    shape: tuple[int, ...],
    name: str,
):
    """Codes -> Convert(f32) -> Subtract(zero) -> Multiply(scale) -> Reshape: the chain
    OpenVINO's CPU plugin fuses into the kernel that reads the weight."""
    import openvino as ov
    from openvino import opset13 as ops

    grouped = codes.shape
    if kind in FOUR_BIT_TYPES:  # two codes a byte, the first in the low nibble (OpenVINO's u4)
        # A tensor of OpenVINO's own: one made over a numpy array would only borrow it.
        tensor = ov.Tensor(ov.Type.u4, ov.Shape(list(grouped)))
        tensor.data[:] = (codes[..., 0::2] | (codes[..., 1::2] << 4)).reshape(-1)
        weight = ops.constant(tensor)
    else:  # 8-bit codes: Q8_0 and Q6_K signed, the 5-bit types' codes in a u8
        code_type = ov.Type.i8 if kind in SIGNED_TYPES else ov.Type.u8
        weight = ops.constant(np.ascontiguousarray(codes), code_type)
    weight.set_friendly_name(name)
    value = ops.convert(weight, ov.Type.f32)
    if kind not in SIGNED_TYPES:
        value = ops.subtract(value, ops.constant(zero))
    value = ops.multiply(value, ops.constant(scale))
    return ops.reshape(value, ops.constant(np.asarray(shape, dtype=np.int64)), False).output(0)
