"""What the CPU does natively: whether a dtype is served as asked (bf16 only where the CPU
multiplies it in hardware)."""

from __future__ import annotations

import functools
from pathlib import Path

__all__ = ["cpu_has_native_bf16", "runs_natively"]

_NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@functools.cache
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX). Without it oneDNN
    emulates bf16 and runs slower than float32, so Shoal keeps float32 there."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return bool(_NATIVE_BF16_FLAGS & set(line.split(":", 1)[1].split()))
    return False


def runs_natively(dtype: str, device: str) -> bool:
    """Whether a profile's `dtype` is served as asked on `device`: a GPU casts the weights;
    a CPU runs bf16 under autocast only where it multiplies bf16 natively, and float32
    otherwise (see `TorchAdapter._set_precision`)."""
    return dtype == "float32" or device != "cpu" or (dtype == "bfloat16" and cpu_has_native_bf16())
