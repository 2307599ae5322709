"""Per-key rate limits: requests and tokens per minute, as OpenAI counts them.

Each key has two token buckets that refill continuously (a full minute's allowance
refills in one minute). A request takes one from the request bucket when admitted and is
refused while the token bucket is empty; the tokens it used (input + output, from the
workers' usage) are taken when it ends, so the bucket may go below zero and then refuses
until it refills. The gateway does no tokenization, so tokens are counted after the fact,
not estimated before.

Limits are kept per gateway process: with N gateways behind a balancer a key gets up to
N times its limits (set them per gateway accordingly).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["Bucket", "RateLimiter", "Verdict"]


class Bucket:
    """One key's allowance of requests or tokens, refilled continuously."""

    __slots__ = ("capacity", "level", "rate", "updated")

    def __init__(self, per_minute: int, now: float) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self.level = self.capacity
        self.updated = now

    def refill(self, now: float) -> float:
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now
        return self.level

    def wait_for(self, amount: float) -> float:
        """Seconds until the bucket holds `amount`."""
        return max(0.0, (amount - self.level) / self.rate)

    def reset_in(self) -> float:
        """Seconds until the bucket is full again."""
        return max(0.0, (self.capacity - self.level) / self.rate)


class Verdict:
    """Whether a request may go on, and the `x-ratelimit-*` headers to send either way."""

    __slots__ = ("allowed", "headers", "limit", "retry_after")

    def __init__(
        self, allowed: bool, retry_after: float, headers: list[tuple[bytes, bytes]], limit: str
    ) -> None:
        self.allowed = allowed
        self.retry_after = retry_after
        self.headers = headers
        self.limit = limit
        """Which limit refused it: `requests` or `tokens` (empty when allowed)."""


def _duration(seconds: float) -> str:
    """OpenAI's reset format: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest}s"


class RateLimiter:
    """Every key's request and token buckets in this gateway process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._requests: dict[str, Bucket] = {}
        self._tokens: dict[str, Bucket] = {}

    def _bucket(self, table: dict[str, Bucket], key: str, per_minute: int, now: float) -> Bucket:
        bucket = table.get(key)
        if bucket is None or bucket.capacity != per_minute:
            bucket = table[key] = Bucket(per_minute, now)
        bucket.refill(now)
        return bucket

    def admit(self, key: str, rpm: int, tpm: int) -> Verdict:
        """Take one request from `key`'s allowance if its limits allow it now."""
        now = self._clock()
        headers: list[tuple[bytes, bytes]] = []
        refusals: list[tuple[str, float]] = []
        requests = tokens = None
        if rpm > 0:
            requests = self._bucket(self._requests, key, rpm, now)
            if requests.level < 1:
                refusals.append(("requests", requests.wait_for(1)))
        if tpm > 0:
            tokens = self._bucket(self._tokens, key, tpm, now)
            if tokens.level <= 0:
                refusals.append(("tokens", tokens.wait_for(1)))
        if not refusals and requests is not None:
            requests.level -= 1
        for name, bucket, limit in (("requests", requests, rpm), ("tokens", tokens, tpm)):
            if bucket is None:
                continue
            headers += [
                (f"x-ratelimit-limit-{name}".encode(), str(limit).encode()),
                (f"x-ratelimit-remaining-{name}".encode(), str(max(0, int(bucket.level))).encode()),
                (f"x-ratelimit-reset-{name}".encode(), _duration(bucket.reset_in()).encode()),
            ]
        if refusals:
            limit, wait = max(refusals, key=lambda r: r[1])
            return Verdict(False, wait, headers, limit)
        return Verdict(True, 0.0, headers, "")

    def tokens_wait(self, key: str, tpm: int) -> float:
        """Seconds until `key` has tokens again (0: it has some now, or no limit); takes
        nothing. Batch lines ask this: they are not requests, but their tokens count."""
        if tpm <= 0:
            return 0.0
        bucket = self._bucket(self._tokens, key, tpm, self._clock())
        return 0.0 if bucket.level > 0 else bucket.wait_for(1)

    def charge(self, key: str, tpm: int, tokens: int) -> None:
        """Take the tokens a finished request used from `key`'s token allowance."""
        if tpm <= 0 or tokens <= 0:
            return
        bucket = self._bucket(self._tokens, key, tpm, self._clock())
        bucket.level -= tokens
