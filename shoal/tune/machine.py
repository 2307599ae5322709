"""The machine a measurement ran on, for reports: results mean little without it."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["machine"]


_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
"""The CPU features that decide what runs fastest (and what bf16 costs)."""


def machine() -> dict[str, Any]:
    import torch

    cpu = "unknown"
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {
        "cpu": cpu,
        "flags": " ".join(f for f in _FLAGS if f in flags),
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
