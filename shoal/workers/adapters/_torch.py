"""What every torch-backed adapter shares: its memory footprint and how it lets go."""

from __future__ import annotations

import torch

from .base import EncoderAdapter

__all__ = ["TorchAdapter"]


class TorchAdapter(EncoderAdapter):
    """An adapter whose loaded model is a torch module in `self.model`."""

    model: torch.nn.Module | None = None
    device: str = "cpu"

    def memory_bytes(self) -> int:
        assert self.model is not None
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def unload(self) -> None:
        self.model = None
        self.lora = None
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()
