"""Requests nobody waits for any more, remembered for a while.

A gateway announces a request id on the cancel subject when its client leaves or its
deadline passes. Workers drop what they hold of it at once, and remember the id so that
its items still queued in the stream are acked unrun when they are pulled later.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["CancelledRequests"]


class CancelledRequests:
    """Request ids cancelled in the last `ttl` seconds, at most `limit` of them (the
    oldest are forgotten first: an item of a request forgotten here still stops at its
    deadline)."""

    def __init__(
        self, ttl: float, limit: int = 100_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl = ttl
        self._limit = limit
        self._clock = clock
        self._expiry: OrderedDict[str, float] = OrderedDict()

    def add(self, request_id: str) -> None:
        now = self._clock()
        self._expiry[request_id] = now + self._ttl
        self._expiry.move_to_end(request_id)
        while self._expiry and (
            len(self._expiry) > self._limit or next(iter(self._expiry.values())) <= now
        ):
            self._expiry.popitem(last=False)

    def __contains__(self, request_id: object) -> bool:
        expiry = self._expiry.get(request_id)  # type: ignore[call-overload]
        return expiry is not None and expiry > self._clock()

    def __len__(self) -> int:
        return len(self._expiry)
