"""A GGUF tensor's blocks as (codes, scale, zero point) per group of weights.

Every block type here is, per group of `group` weights, w = (code - zero) * scale with
integer codes, which is the chain OpenVINO's CPU plugin fuses into the kernel that reads
a compressed weight. The formulas are llama.cpp's (ggml-quants), per block:

- Q4_0: 32 weights, w = d * (q - 8), q in 0..15;
- Q4_1: 32 weights, w = d * q + m: zero = -m / d, kept in float32, never rounded onto an
  integer zero point (as int4 tools do);
- Q8_0: 32 weights, w = d * q, q signed;
- Q5_0 / Q5_1: as Q4_0 / Q4_1 with a fifth bit per weight (w = d * (q - 16); w = d * q + m);
- Q4_K and Q5_K: a super-block of 256 with an f16 scale d and minimum dmin, and 6-bit
  scale and minimum per group of 32: w = (d * sc) * q - (dmin * m), q 4 or 5 bits. d * sc
  (11 bits times 6) is exact in float32, so each group keeps its exact scale, and
  zero = (dmin * m) / (d * sc);
- Q6_K: a super-block of 256 with an f16 d and a signed 8-bit scale per group of 16:
  w = (d * sc) * (q - 32), q 6 bits, stored here as the signed code q - 32.

Where a code has more bits than OpenVINO's u4 holds (Q5_x's 5, Q6_K's 6), it is stored in
8 bits: wider than the file, still its own codes on its own grid, never float. The
6-bit scales are unpacked with gguf-py's own `Q4_K.get_scale_min`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BLOCK_TYPES", "FOUR_BIT_TYPES", "SIGNED_TYPES", "blocks"]

BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
FOUR_BIT_TYPES = {"Q4_0", "Q4_1", "Q4_K"}  # codes fit OpenVINO's u4
SIGNED_TYPES = {"Q8_0", "Q6_K"}  # codes are i8 and there is no zero point
_SUPER = 256  # weights per K-quant super-block


def blocks(raw: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes, scale, zero) of a tensor stored as `kind`, `raw` its bytes one row a row:
    codes (rows, groups, group) uint8 (int8 for the signed types), scale and zero float32
    (rows, groups, 1), or broadcastable to it."""
    import gguf

    size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]][1]
    per_row = raw.reshape(raw.shape[0], -1, size)
    rows = per_row.shape[0]
    unpack = _K_QUANTS.get(kind)
    if unpack is not None:
        codes, scale, zero = unpack(per_row.reshape(-1, size))
        return tuple(a.reshape(rows, -1, a.shape[-1]) for a in (codes, scale, zero))
    scale = _f16(per_row[..., 0:2])
    if kind == "Q8_0":
        return per_row[..., 2:].copy().view(np.int8), scale, np.zeros_like(scale)
    start = 4 if kind in ("Q4_1", "Q5_1") else 2  # past d (and m)
    if kind in ("Q5_0", "Q5_1"):  # 4 bytes, little-endian: bit j is weight j's fifth bit
        high = per_row[..., start : start + 4].copy().view("<u4")
        fifth = ((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        codes = _nibbles(per_row[..., start + 4 :]) | (fifth << 4)
    else:
        codes = _nibbles(per_row[..., start:])
    if kind in ("Q4_0", "Q5_0"):
        middle = 8.0 if kind == "Q4_0" else 16.0
        return codes, scale, np.full((1, 1, 1), middle, dtype=np.float32)
    return codes, scale, _zero(-_f16(per_row[..., 2:4]), scale)


def _f16(two_bytes: np.ndarray) -> np.ndarray:
    return two_bytes.copy().view(np.float16).astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """Q4_x/Q5_x: byte j of a block holds weight j in its low nibble, j + 16 in its high."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def _zero(minimum: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The float zero point z with (q - z) * scale == q * scale - minimum."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(scale != 0, minimum / scale, 0.0).astype(np.float32)


def _k_scales(per_block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: (scale, minimum) per group of 32, (blocks, 8, 1) float32."""
    from gguf.quants import Q4_K

    d, dmin = _f16(per_block[:, 0:2]), _f16(per_block[:, 2:4])
    sc, m = Q4_K.get_scale_min(per_block[:, 4:16])
    return (d * sc).astype(np.float32)[..., None], (dmin * m).astype(np.float32)[..., None]


def _shifted(packed: np.ndarray, width: int, *shifts: int) -> np.ndarray:
    """(blocks, runs, len(shifts), width): each run of `width` bytes shifted right by each
    of `shifts`, the way K-quants lay several groups' bits into the same bytes."""
    by = np.array(shifts, dtype=np.uint8).reshape(1, 1, -1, 1)
    return packed.reshape(packed.shape[0], -1, 1, width) >> by


def _low_nibbles_then_high(packed: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K: each 32 bytes hold two groups of 32, the first in the low nibbles."""
    return (_shifted(packed, 32, 0, 4) & 0x0F).reshape(packed.shape[0], -1, 32)


def _q4_k(per_block: np.ndarray):
    scale, minimum = _k_scales(per_block)
    return _low_nibbles_then_high(per_block[:, 16:]), scale, _zero(minimum, scale)


def _q5_k(per_block: np.ndarray):
    scale, minimum = _k_scales(per_block)
    n = per_block.shape[0]  # bit g of byte l is the 5th bit of weight l of group g
    fifth = (_shifted(per_block[:, 16:48], 32, *range(8)) & 0x01).reshape(n, -1, 32)
    codes = _low_nibbles_then_high(per_block[:, 48:]) | (fifth << 4)
    return codes, scale, _zero(minimum, scale)


def _q6_k(per_block: np.ndarray):
    n = per_block.shape[0]  # low 4 bits: 64-byte runs, two groups; high 2: 32, four groups
    low = (_shifted(per_block[:, :128], 64, 0, 4) & 0x0F).reshape(n, -1, 32)
    high = (_shifted(per_block[:, 128:192], 32, 0, 2, 4, 6) & 0x03).reshape(n, -1, 32)
    codes = ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8)
    scale = _f16(per_block[:, 208:210]) * per_block[:, 192:208].copy().view(np.int8)
    scale = scale.astype(np.float32)[..., None]
    return codes.reshape(n, _SUPER // 16, 16), scale, np.zeros_like(scale)


_K_QUANTS = {"Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
