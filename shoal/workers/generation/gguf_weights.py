"""A GGUF's quantized blocks as the OpenVINO model's weights: the checkpoint as shipped.

The model's OpenVINO IR is exported (optimum) from the float32 copy of the GGUF (gguf.py
dequantizes it). That copy is the reference, and serving it reads ~6x the bytes the file
holds: SmolLM2-135M's Q4_1 blocks are 85 MB, its float32 copy 540 MB, and one decode
step reads every weight. This module puts the file's own blocks back: each weight the
GGUF stores quantized becomes its codes (4 or 8 bits), with the file's f16 scale (and
minimum) per block of 32, decompressed inside the matmul. OpenVINO's CPU plugin fuses
the Convert, Subtract, Multiply chain into its FullyConnected (and Gather) kernels, so a
step reads the 4-bit codes, not a widened copy.

The file's arithmetic, per block of 32 (llama.cpp's ggml-quants):
- Q4_0: w = d * (q - 8), q in 0..15;
- Q4_1: w = d * q + m, written here as (q - z) * d with z = -m / d kept in float32,
  never rounded onto an integer zero point (as int4 tools do): the same value within
  float32 rounding (checked, below);
- Q8_0: w = d * q, q signed.
Other tensor types (K-quants, F16, F32) keep the exported float32 constant.

Every replaced weight is checked against the exported constant (gguf-py's dequantizing
of the same bytes): where they differ by more than float32 rounding (a layout this
module does not know), that weight keeps its float32 constant and the log says so.
Names map with gguf-py's own tensor-name table; llama-style Q and K rows, which the GGUF
stores permuted for its rotary layout, are put back the way transformers reads them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import msgspec
import numpy as np

__all__ = ["NativeWeights", "native_weights"]

log = logging.getLogger(__name__)

_BLOCK = 32  # weights per block in Q4_0, Q4_1 and Q8_0
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
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
    weight constant the GGUF at `gguf_path` stores as Q4_0, Q4_1 or Q8_0 by its blocks."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    arch = _field(reader, "general.architecture")
    blocks = int(_field(reader, f"{arch}.block_count"))
    heads = {int(_field(reader, f"{arch}.attention.head_count"))}
    kv_heads = _field(reader, f"{arch}.attention.head_count_kv")
    if kv_heads is not None:
        heads.add(int(kv_heads))
    names = gguf.get_tensor_name_map(_arch(gguf, arch), blocks)
    tensors = {t.name: t for t in reader.tensors}
    done = NativeWeights()
    for const in _weight_constants(model):
        hf_name = const.get_friendly_name().removeprefix("self.").removesuffix(".weight")
        gguf_name = names.get_name(hf_name)
        tensor = tensors.get(f"{gguf_name}.weight") if gguf_name else None
        if tensor is None:
            continue
        kind = tensor.tensor_type.name
        if kind not in _BLOCK_BYTES:
            if kind not in _FLOAT_TYPES:  # K-quants and others: not expressed here yet
                done.kept[hf_name] = f"{kind} blocks are not served as blocks yet"
            continue
        exported = const.get_data()
        raw = np.asarray(tensor.data).reshape(exported.shape[0], -1)
        blocks = _matching_blocks(raw, kind, exported, heads)
        if blocks is None:
            done.kept[hf_name] = f"{kind} blocks do not match the exported weights"
            continue
        node = _decompressed(*blocks, kind, exported.shape, const.get_friendly_name())
        for target in list(const.output(0).get_target_inputs()):
            target.replace_source_output(node)
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


def _weight_constants(model) -> Iterable:
    """The named weight constants of optimum's export, each once."""
    for op in model.get_ops():
        named = op.get_type_name() == "Constant" and op.get_friendly_name().endswith(".weight")
        if named and len(op.get_output_shape(0)) == 2:
            yield op


def _matching_blocks(raw: np.ndarray, kind: str, exported: np.ndarray, heads: set[int]):
    """The blocks (`_blocks`) with the GGUF rows in the exported constant's order (the
    file's, or the llama Q/K layout put back for one of `heads`), or None when neither
    gives the same weights."""
    n = raw.shape[0]
    candidates = [np.arange(n)]
    for h in sorted(heads):
        if n % (2 * h) == 0:  # transformers' reverse_permute_weights, on row numbers
            candidates.append(np.arange(n).reshape(h, n // h // 2, 2).swapaxes(2, 1).reshape(n))
    limit = _TOLERANCE * max(float(np.abs(exported).max()), 1e-30)
    for rows in candidates:
        codes, scale, zero = _blocks(raw[rows], kind)
        served = ((codes.astype(np.float32) - zero) * scale).reshape(exported.shape)
        if np.abs(served - exported).max() <= limit:
            return codes, scale, zero
    return None


def _blocks(raw: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes, scale, zero point) per block: codes (rows, groups, 32), uint8 for 4-bit
    types and int8 for Q8_0; scale float32 (an f16 of the file, exactly); zero float32."""
    blocks = raw.reshape(raw.shape[0], -1, _BLOCK_BYTES[kind])
    scale = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
    if kind == "Q8_0":
        return blocks[..., 2:].copy().view(np.int8), scale, np.zeros_like(scale)
    nibbles = blocks[..., 4:] if kind == "Q4_1" else blocks[..., 2:]
    # Byte j holds weight j in its low nibble and weight j + 16 in its high one.
    codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1)
    if kind == "Q4_0":
        return codes, scale, np.full((1, 1, 1), 8.0, dtype=np.float32)
    minimum = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        zero = np.where(scale != 0, -minimum / scale, 0.0).astype(np.float32)
    return codes, scale, zero


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
    if kind == "Q8_0":
        weight = ops.constant(np.ascontiguousarray(codes), ov.Type.i8)
    else:  # two codes a byte, the first in the low nibble (OpenVINO's u4 layout)
        # A tensor of OpenVINO's own: one made over a numpy array would only borrow it.
        tensor = ov.Tensor(ov.Type.u4, ov.Shape(list(grouped)))
        tensor.data[:] = (codes[..., 0::2] | (codes[..., 1::2] << 4)).reshape(-1)
        weight = ops.constant(tensor)
    weight.set_friendly_name(name)
    value = ops.convert(weight, ov.Type.f32)
    if kind != "Q8_0":
        value = ops.subtract(value, ops.constant(zero))
    value = ops.multiply(value, ops.constant(scale))
    return ops.reshape(value, ops.constant(np.asarray(shape, dtype=np.int64)), False).output(0)
