"""Token-budget batching with an adaptive coalescing window. Pure: no I/O, injected clock.

Units of work (one input text each, with a cost in tokens) arrive in FIFO order. When the
model is free the worker asks `ready(now)`:

- a full batch (`max_batch_items` units or `max_batch_tokens` tokens) is ready at once;
- otherwise the batcher may hold the partial batch open for `max_wait_ms` after its oldest
  unit arrived, so that units arriving together share one forward pass. It does so only
  while arrivals come faster than that window (an EWMA of inter-arrival gaps below
  `max_wait_ms`); when they are sparser, waiting would only add latency, so the window is
  zero. Under load the window matters little: units pile up while the previous batch
  runs and the next one is full at once.

`take()` removes the next round: FIFO units up to the item and token budgets (oldest
first, so no unit starves), sorted by length and cut into sub-batches whose padded cost
(rows x longest row) stays within `max_batch_tokens`, which keeps padding small.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from ..model_registry import BatchProfile

__all__ = ["Batcher", "Costed"]


class Costed(Protocol):
    @property
    def cost(self) -> int: ...


T = TypeVar("T", bound=Costed)

_EWMA = 0.2


class Batcher(Generic[T]):
    def __init__(self, profile: BatchProfile, clock: Callable[[], float]) -> None:
        self.profile = profile
        self._clock = clock
        self._units: deque[tuple[float, T]] = deque()
        self._tokens = 0
        self._last_arrival: float | None = None
        self._gap: float | None = None

    def __len__(self) -> int:
        return len(self._units)

    @property
    def pending_tokens(self) -> int:
        return self._tokens

    def add(self, units: list[T]) -> None:
        """Queue units that arrived together (one work item's inputs)."""
        if not units:
            return
        now = self._clock()
        if self._last_arrival is not None:
            gap = now - self._last_arrival
            self._gap = gap if self._gap is None else (1 - _EWMA) * self._gap + _EWMA * gap
        self._last_arrival = now
        for unit in units:
            self._units.append((now, unit))
            self._tokens += unit.cost

    def window(self) -> float:
        """Seconds to hold a partial batch open for more arrivals."""
        cap = self.profile.max_wait_ms / 1000.0
        return cap if self._gap is not None and self._gap < cap else 0.0

    def _full(self) -> bool:
        p = self.profile
        return len(self._units) >= p.max_batch_items or self._tokens >= p.max_batch_tokens

    def ready_at(self) -> float | None:
        """When `take()` should be called (clock time), or None if nothing is pending."""
        if not self._units:
            return None
        if self._full():
            return self._clock()
        return self._units[0][0] + self.window()

    def ready(self) -> bool:
        at = self.ready_at()
        return at is not None and at <= self._clock()

    def take(self) -> list[list[T]]:
        """The next round of sub-batches (empty if nothing is pending)."""
        p = self.profile
        chosen: list[T] = []
        tokens = 0
        while self._units and len(chosen) < p.max_batch_items:
            cost = self._units[0][1].cost
            if chosen and tokens + cost > p.max_batch_tokens:
                break
            chosen.append(self._units.popleft()[1])
            tokens += cost
        self._tokens -= tokens
        chosen.sort(key=lambda u: u.cost)
        batches: list[list[T]] = []
        current: list[T] = []
        for unit in chosen:
            if current and (len(current) + 1) * unit.cost > p.max_batch_tokens:
                batches.append(current)
                current = []
            current.append(unit)
        if current:
            batches.append(current)
        return batches

    def drop(self, keep: Callable[[T], bool]) -> list[T]:
        """Remove units for which `keep` is false (expired or cancelled); returns them."""
        dropped = [u for _, u in self._units if not keep(u)]
        if dropped:
            self._units = deque((t, u) for t, u in self._units if keep(u))
            self._tokens = sum(u.cost for _, u in self._units)
        return dropped
