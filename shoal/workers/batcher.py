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

`take()` removes the next batch: the oldest pending unit (so none starves) with the
pending units closest to it in length, up to `max_batch_items` and while the padded cost
(rows x longest row) stays within `max_batch_tokens`. Choosing by length from the whole
pending pool rather than cutting FIFO rounds keeps padding small: on short queries of
10-30 tokens, FIFO rounds of 64 ran the model at 0.73 of its speed on fully length-sorted
batches, while this choice from a pool of four batches matched it (perf/batch_padding.py,
results in perf/results/). The worker keeps about four batches pending for this. Where
a batch's inputs are packed into rows (adapters/_packing.py: on a CPU, whatever the
engine) padding costs little either way, yet the choice and the padded cost still pay:
they keep passages with passages and queries with queries, so queries pack into narrow
rows whose attention is cheap. On one passage per seven queries, costing packed batches
by their tokens instead ran slower (perf/results, "How close the engine runs"). And
the choice serves the padded paths (a GPU, left-padded tokenizers, models whose packing
check failed).
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
    """Pending units of one (model, op, adapter, lane), cut into token-budget batches."""

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

    def take(self, token_share: float = 1.0) -> list[T]:
        """The next batch (empty if nothing is pending): the oldest unit, joined by the
        pending units closest to it in length (older first among equals), up to the item
        budget and while rows x longest row stays within the token budget, scaled down by
        `token_share` (for low-priority work while live work is about). A batch has at
        least one unit, whatever its length."""
        if not self._units:
            return []
        max_tokens = max(1, int(self.profile.max_batch_tokens * token_share))
        max_items = self.profile.max_batch_items
        pending = [unit for _, unit in self._units]
        target = pending[0].cost
        order = sorted(range(len(pending)), key=lambda i: (abs(pending[i].cost - target), i))
        chosen: list[int] = []
        longest = 0
        for i in order:
            cost = pending[i].cost
            width = max(longest, cost)
            if chosen and (len(chosen) + 1) * width > max_tokens:
                continue
            chosen.append(i)
            longest = width
            if len(chosen) >= max_items:
                break
        taken = set(chosen)
        self._units = deque(entry for i, entry in enumerate(self._units) if i not in taken)
        batch = [pending[i] for i in sorted(chosen, key=lambda i: pending[i].cost)]
        self._tokens -= sum(u.cost for u in batch)
        return batch

    def drop(self, keep: Callable[[T], bool]) -> list[T]:
        """Remove units for which `keep` is false (expired or cancelled); returns them."""
        dropped = [u for _, u in self._units if not keep(u)]
        if dropped:
            self._units = deque((t, u) for t, u in self._units if keep(u))
            self._tokens = sum(u.cost for _, u in self._units)
        return dropped
