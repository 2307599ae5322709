"""LoRA adapters (peft) on a resident base module: at most `capacity`, least recently used
evicted, one active per forward pass (batches never mix adapters).

The base module is wrapped in a `peft.PeftModel` on the first adapter; the base model's
own output is then the wrapper with its adapters disabled. Everything here mutates the
model, so it runs on the forward thread, between batches.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator

import torch

__all__ = ["LoraSlots"]


class LoraSlots:
    """The LoRA adapters loaded into one model, and which one is active."""

    def __init__(
        self,
        get_module: Callable[[], torch.nn.Module],
        set_module: Callable[[torch.nn.Module], None],
        capacity: int,
    ) -> None:
        self._get = get_module
        self._set = set_module
        self.capacity = max(1, capacity)
        self._loaded: OrderedDict[str, str] = OrderedDict()  # name -> path
        self.evictions = 0
        self.active_name = ""
        """The adapter of the forward pass running now ("" for the base model)."""

    def loaded(self) -> list[str]:
        return list(self._loaded)

    def ensure(self, name: str, path: str) -> None:
        """Load adapter `name` from `path` unless it is loaded already (from that path)."""
        from peft import PeftModel

        if self._loaded.get(name) == path:
            self._loaded.move_to_end(name)
            return
        module = self._get()
        if isinstance(module, PeftModel):
            if name in self._loaded:
                module.delete_adapter(name)
                del self._loaded[name]
            while len(self._loaded) >= self.capacity:
                oldest, _ = self._loaded.popitem(last=False)
                module.delete_adapter(oldest)
                self.evictions += 1
            module.load_adapter(path, adapter_name=name)
        else:
            wrapped = PeftModel.from_pretrained(module, path, adapter_name=name)
            wrapped.eval()
            self._set(wrapped)
        self._loaded[name] = path

    def drop(self, name: str) -> None:
        """Forget adapter `name` (it was removed from the registry)."""
        if name not in self._loaded:
            return
        module = self._get()
        if len(self._loaded) > 1:
            module.delete_adapter(name)
        else:  # the last one: back to the bare base module
            self._set(module.unload())
        del self._loaded[name]

    @contextlib.contextmanager
    def active(self, name: str) -> Iterator[None]:
        """Run the enclosed forward pass with adapter `name`, or the base model for ""."""
        self.active_name = name
        try:
            with self._activate(name):
                yield
        finally:
            self.active_name = ""

    @contextlib.contextmanager
    def _activate(self, name: str) -> Iterator[None]:
        from peft import PeftModel

        module = self._get()
        if not isinstance(module, PeftModel):
            if name:
                raise KeyError(name)
            yield
            return
        if not name:
            with module.disable_adapter():
                yield
            return
        if name not in self._loaded:
            raise KeyError(name)
        self._loaded.move_to_end(name)
        module.set_adapter(name)
        yield
