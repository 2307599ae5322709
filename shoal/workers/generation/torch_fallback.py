"""The transformers engine beside a runtime, for the requests that runtime cannot serve
(on OpenVINO GenAI: LoRA adapters and `top_logprobs`), loaded on the first such request."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .engine import SequenceRequest, TokenEvent
from .runtime import GenerationRuntime

__all__ = ["TorchFallback"]

log = logging.getLogger(__name__)


class TorchFallback:
    """The transformers engine for what GenAI cannot do, loaded on its first request (on
    a thread of its own, so the pipeline keeps stepping meanwhile)."""

    def __init__(self, make: Callable[[], GenerationRuntime]) -> None:
        self._make = make
        self.path = ""
        self.on_events: Callable[[list[TokenEvent]], None] = lambda events: None
        self._runtime: GenerationRuntime | None = None
        self._waiting: list[SequenceRequest] = []
        self._loading = False
        self._lock = threading.Lock()

    def submit(self, requests: list[SequenceRequest]) -> None:
        with self._lock:
            if self._runtime is not None:
                self._runtime.submit(requests)
                return
            self._waiting.extend(requests)
            if self._loading:
                return
            self._loading = True
        threading.Thread(target=self._load, name="shoal-gen-fallback", daemon=True).start()

    def _load(self) -> None:
        log.info("loading the transformers engine beside OpenVINO (LoRA or top_logprobs)")
        try:
            runtime = self._make()
            runtime.start(self.path, self.on_events)
        except Exception as exc:
            log.exception("the transformers engine failed to load")
            with self._lock:
                waiting, self._waiting, self._loading = self._waiting, [], False
            self.on_events([TokenEvent(r.job, r.choice, error=str(exc)) for r in waiting])
            return
        with self._lock:
            self._runtime, waiting, self._waiting = runtime, self._waiting, []
        if waiting:
            runtime.submit(waiting)

    def cancel(self, job: str) -> None:
        with self._lock:
            self._waiting = [r for r in self._waiting if r.job != job]
            runtime = self._runtime
        if runtime is not None:
            runtime.cancel(job)

    @property
    def running(self) -> int:
        runtime = self._runtime
        return len(self._waiting) + (runtime.running if runtime is not None else 0)

    @property
    def max_batch(self) -> int:
        return self._runtime.max_batch if self._runtime is not None else 0

    def stop(self) -> None:
        if self._runtime is not None:
            self._runtime.stop()
