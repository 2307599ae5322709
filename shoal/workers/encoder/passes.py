"""When the encoder worker runs a forward pass alone on all its threads, and when two passes
side by side (each in an engine stream of its own).

Alone is best at low load: one batch gets every thread, so a request waits least. Under
load on a CPU that other processes share (the gateway, nats-server, clients), a pass on
all threads stalls at every layer whenever one of its threads is preempted; two passes of
one thread each keep going (measured in perf/results/README.md). So the planner follows
how busy the forward passes have kept the worker lately (their compute only: a pass's
answers are sent after it): past `enter` it pairs passes, below `leave` it goes back to
one at a time; the gap keeps it from flapping at the boundary. `enter` is high because a
pass beside nothing runs on half the threads: at half the knee, pairing costs latency
that one pass at a time does not. While pairing, a pass computing beside nothing counts
0.5: the work a pass alone would do in half the time; so `leave` is above 0.5, or one pass
at a time on one stream would look busy enough to stay paired at half the knee (and pay
that latency).

A pass beside another takes half the batch token budget: on half the threads it then ends
about when a full batch alone would, so a request queued behind it waits no longer than
behind one pass alone (near the knee its p99 falls, and the knee holds: the figures are
in perf/results/README.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum

__all__ = ["Pass", "PassPlanner"]


class Pass(Enum):
    ALONE = "alone"
    """On all the threads; nothing else runs."""
    BESIDE = "beside"
    """In one of two streams sharing the threads; another pass may run in the other."""


_SHARE = {Pass.ALONE: 1.0, Pass.BESIDE: 0.5}
"""Of the forward capacity, what a computing pass takes."""


class PassPlanner:
    """Which pass may start now, from the passes running and the recent load."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        pairs: bool,
        enter: float = 0.9,
        leave: float = 0.6,
        window_s: float = 1.0,
    ) -> None:
        """`pairs`: whether this worker may pair passes at all (a CPU with two threads or
        more). `enter` and `leave` bound the busy share (0..1) that switches pairing on and
        off; `window_s` is the time constant of its moving average."""
        self._clock = clock
        self._pairs = pairs
        self._enter, self._leave, self._window = enter, leave, window_s
        self._busy = 0.0
        """Moving average of the forward capacity computing: 1 while a pass computes alone
        or two side by side, 0.5 while one computes beside nothing."""
        self._computing = 0.0
        self._at = clock()
        self.pairing = False
        self.alone = 0
        self.beside = 0
        self.side_by_side = 0
        """Passes started beside another running one, so far."""

    def next(self, may_pair: bool) -> Pass | None:
        """How the next pass runs (`may_pair`: its engine and op allow a stream of its own),
        or None while it must wait for the running passes."""
        self._update()
        if self.alone or self.beside >= 2:
            return None
        if self.beside:
            return Pass.BESIDE if self.pairing and may_pair else None
        return Pass.BESIDE if self.pairing and may_pair else Pass.ALONE

    def has_room(self) -> bool:
        """Whether a pass could start beside the running ones (a pull may bring its work)."""
        return self.pairing and self.beside == 1 and not self.alone

    def started(self, mode: Pass) -> None:
        self._update()
        if mode is Pass.ALONE:
            self.alone += 1
        else:
            self.side_by_side += self.beside
            self.beside += 1
        self._computing += _SHARE[mode]

    def computed(self, mode: Pass) -> None:
        """The pass's forward is over; it holds its place until `ended`."""
        self._update()
        self._computing -= _SHARE[mode]

    def ended(self, mode: Pass) -> None:
        self._update()
        if mode is Pass.ALONE:
            self.alone -= 1
        else:
            self.beside -= 1

    @property
    def busy(self) -> float:
        self._update()
        return self._busy

    def _update(self) -> None:
        now = self._clock()
        elapsed, self._at = now - self._at, now
        if elapsed > 0:
            keep = math.exp(-elapsed / self._window)
            self._busy = self._busy * keep + min(1.0, self._computing) * (1 - keep)
        if not self._pairs:
            return
        if not self.pairing and self._busy >= self._enter:
            self.pairing = True
        elif self.pairing and self._busy <= self._leave:
            self.pairing = False
