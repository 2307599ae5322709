"""Which models stay in a worker's memory: a byte budget, pinned models, LRU eviction.

Pure bookkeeping (the worker does the loading and unloading): `plan(model, need, busy)`
says which resident models to evict so that `need` more bytes fit, oldest use first,
never a pinned model and never one that is busy (work queued or running); None when the
busy ones are in the way for now (try again when something finishes); and
`ModelTooLargeError` when the model cannot fit even with everything evictable gone.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from pathlib import Path

__all__ = ["ModelTooLargeError", "Residency", "available_memory", "weight_bytes"]


class ModelTooLargeError(Exception):
    """The model does not fit the memory budget even alone."""

    def __init__(self, model: str, need: int, room: int) -> None:
        super().__init__(
            f"model '{model}' needs about {need / 2**20:.0f} MiB, more than the "
            f"{room / 2**20:.0f} MiB this worker can give it"
        )
        self.model = model


class Residency:
    """Which models are loaded and what to evict to fit the next one."""

    def __init__(self, budget: int, pinned: Collection[str], clock: Callable[[], float]) -> None:
        self.budget = budget
        self.pinned = set(pinned)
        self._clock = clock
        self.resident: dict[str, int] = {}
        self._last_used: dict[str, float] = {}
        self.loads = 0
        self.evictions = 0

    @property
    def used(self) -> int:
        return sum(self.resident.values())

    def touch(self, model: str) -> None:
        self._last_used[model] = self._clock()

    def plan(self, model: str, need: int, busy: Collection[str]) -> list[str] | None:
        """Models to evict before loading `model` (`need` bytes).

        Raises:
            ModelTooLargeError: it cannot fit even with every unpinned model evicted.
        """
        pinned_bytes = sum(b for m, b in self.resident.items() if m in self.pinned and m != model)
        room = self.budget - pinned_bytes
        if need > room and model not in self.pinned:
            raise ModelTooLargeError(model, need, room)
        free = self.budget - self.used
        if need <= free or model in self.pinned:
            return []
        evict: list[str] = []
        candidates = sorted(
            (m for m in self.resident if m not in self.pinned and m not in busy and m != model),
            key=lambda m: self._last_used.get(m, 0.0),
        )
        for candidate in candidates:
            evict.append(candidate)
            free += self.resident[candidate]
            if need <= free:
                return evict
        return None

    def loaded(self, model: str, size: int) -> None:
        self.resident[model] = size
        self.loads += 1
        self.touch(model)

    def resized(self, model: str, size: int) -> None:
        """A resident model now takes `size` bytes (an engine compiled another copy)."""
        if model in self.resident and size:
            self.resident[model] = size

    def evicted(self, model: str) -> None:
        if self.resident.pop(model, None) is not None:
            self.evictions += 1


def weight_bytes(path: str) -> int:
    """Bytes of weight files under a local model directory (0 for a hub id)."""
    root = Path(path)
    if not root.is_dir():
        return 0
    suffixes = {".safetensors", ".bin", ".pt", ".pth", ".gguf"}
    return sum(f.stat().st_size for f in root.rglob("*") if f.suffix in suffixes and f.is_file())


def available_memory(device: str) -> int:
    """Bytes free now: on the GPU for a CUDA device, else in RAM (MemAvailable)."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
