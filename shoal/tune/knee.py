"""The knee: throughput where a server stops keeping up, and latency below it.

Open loop: requests leave on a fixed schedule at the offered rate whatever the answers
do (a closed loop would slow down with the server and hide its queueing). A short
closed-loop probe estimates the capacity C; steps then offer shares of C for a fixed time
each. Per step: offered and achieved units/s (texts, documents or generated tokens), p50,
p90, p99 latency, errors. The knee is the best achieved throughput of a step that kept up
(answered >= 90% of offered requests with p99 within a bound). `shoal tune` measures each
candidate profile this way, and `python -m perf knee` each server it compares.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

__all__ = ["Knee", "Load", "Step", "describe", "find_knee", "kept_up", "quantile"]

KEEPS_UP = 0.9
"""Share of the offered requests a step must answer to count as keeping up."""
REQUEST_TIMEOUT = 30.0
MAX_EXTRA_STEPS = 4
"""Steps beyond the given shares at most: 25% more load each past the last while they
keep up, or half the load each below the first while none has."""
MAX_OUTSTANDING = 4096
"""Requests in flight at most; past it a scheduled request counts as refused (bounded)."""


@dataclass
class Step:
    offered_rps: float
    offered_tps: float
    """Units (texts, documents, tokens) per second offered."""
    achieved_tps: float = 0.0
    achieved_rps: float = 0.0
    sent: int = 0
    ok: int = 0
    units: int = 0
    errors: int = 0
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None


@dataclass
class Knee:
    capacity_rps: float = 0.0
    """Requests/s the closed-loop probe answered."""
    steps: list[Step] = field(default_factory=list)
    knee_tps: float = 0.0
    """Best units/s of a step that kept up (at most what it was offered); 0 when none did."""
    knee_p50_ms: float | None = None
    knee_p99_ms: float | None = None
    """Latency of the step the knee was measured in."""
    p50_at_half_knee_ms: float | None = None


def quantile(values: Sequence[float], q: float) -> float | None:
    """The `q` quantile of `values` (the nearest rank), None for none: every latency
    figure of the knee and of perf/ is read this one way."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _percentile(ordered: list[float], q: float) -> float | None:
    """In milliseconds, from seconds."""
    value = quantile(ordered, q)
    return None if value is None else value * 1000


class Load:
    """Request bodies sent in turn to `url`; `count(answer)` says how many units an
    answer carries (0 for a wrong one)."""

    def __init__(
        self, url: str, bodies: Sequence[dict], per_request: int, count: Callable[[dict], int]
    ) -> None:
        self.url = url
        self.bodies = bodies
        self.per_request = per_request
        self.count = count
        self.cursor = 0

    def client(self) -> httpx.AsyncClient:
        """A client with room for an overloaded step's connections."""
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
        return httpx.AsyncClient(timeout=REQUEST_TIMEOUT, limits=limits)

    def body(self) -> dict:
        self.cursor = (self.cursor + 1) % len(self.bodies)
        return self.bodies[self.cursor]

    async def one(self, client: httpx.AsyncClient) -> tuple[int, float]:
        """(units the answer carries, 0 on any error; seconds it took)."""
        started = time.perf_counter()
        try:
            r = await client.post(self.url, json=self.body())
            units = self.count(r.json()) if r.status_code == 200 else 0
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            units = 0
        return units, time.perf_counter() - started

    async def probe(self, client: httpx.AsyncClient, seconds: float, concurrency: int) -> float:
        """Closed loop: requests/s answered with `concurrency` in flight."""
        done = 0
        deadline = time.perf_counter() + seconds

        async def loop() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                units, _ = await self.one(client)
                done += units > 0

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)

    async def step(self, client: httpx.AsyncClient, rps: float, seconds: float) -> Step:
        """Open loop at `rps` for `seconds`; waits for the stragglers (bounded)."""
        step = Step(offered_rps=rps, offered_tps=rps * self.per_request)
        latencies: list[float] = []
        tasks: set[asyncio.Task] = set()
        started = time.perf_counter()
        last_done = started

        def finished(task: asyncio.Task) -> None:
            nonlocal last_done
            tasks.discard(task)
            units, seconds_taken = task.result()
            last_done = time.perf_counter()
            if units:
                step.ok += 1
                step.units += units
                latencies.append(seconds_taken)
            else:
                step.errors += 1

        count = max(1, round(rps * seconds))
        for i in range(count):
            delay = started + i / rps - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            step.sent += 1
            if len(tasks) >= MAX_OUTSTANDING:
                step.errors += 1
                continue
            task = asyncio.create_task(self.one(client))
            tasks.add(task)
            task.add_done_callback(finished)
        if tasks:
            await asyncio.wait(set(tasks), timeout=REQUEST_TIMEOUT + 5)
        latencies.sort()
        # The window the answers came in, shifted by the shortest latency (seconds for a
        # chat answer): a server that keeps up answers the last request about that long
        # after it was sent; one that falls behind answers later and its rate drops.
        elapsed = max(seconds, last_done - started - (latencies[0] if latencies else 0.0))
        step.achieved_tps = step.units / elapsed
        step.achieved_rps = step.ok / elapsed
        step.p50_ms = _percentile(latencies, 0.5)
        step.p90_ms = _percentile(latencies, 0.9)
        step.p99_ms = _percentile(latencies, 0.99)
        return step


def kept_up(step: Step, p99_bound: float) -> bool:
    """Whether a step answered (nearly) all it was offered, within `p99_bound` seconds."""
    # Requests, not units: a chat answer may end before max_tokens and still keep up.
    return (
        step.achieved_rps >= KEEPS_UP * step.offered_rps
        and step.p99_ms is not None
        and step.p99_ms <= p99_bound * 1000
    )


def describe(step: Step, unit: str) -> str:
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.0f}"

    return (
        f"offered {step.offered_tps:7.1f} {unit}/s -> {step.achieved_tps:7.1f}, "
        f"p50/p90/p99 {ms(step.p50_ms)}/{ms(step.p90_ms)}/{ms(step.p99_ms)} ms, "
        f"errors {step.errors}"
    )


async def find_knee(
    load: Load,
    *,
    fractions: Sequence[float],
    step_seconds: float,
    p99_bound: float,
    probe_seconds: float,
    warmup_seconds: float = 3.0,
    half_knee: bool = True,
    on_step: Callable[[Step], None] | None = None,
) -> Knee:
    """Warm up, probe the capacity, then step the offered load through `fractions` of it
    until two steps have not kept up (halving it first while not even the lowest has);
    with `half_knee`, one more step at half the knee's request rate measures p50 below the
    knee.

    Each step gets its own client (the closed-loop probes share one): httpx's pool keeps
    every connection an overloaded step opened, and its bookkeeping over them then costs
    the load generator most of a core on every later request: a step below capacity
    after an overloaded one then measured the generator, not the server.
    """
    knee = Knee()
    async with load.client() as client:  # closed loops: never more than 16 connections
        await load.probe(client, warmup_seconds, 8)  # model resident, connections open
        knee.capacity_rps = await load.probe(client, probe_seconds, 16)
    over = extra = 0
    shares = list(fractions)
    for fraction in shares:
        async with load.client() as client:
            step = await load.step(client, max(0.1, fraction * knee.capacity_rps), step_seconds)
        knee.steps.append(step)
        if on_step is not None:
            on_step(step)
        if kept_up(step, p99_bound):
            # A step cannot sustain more than it was offered; above it is the backlog of
            # a short step drained late (long answers, as in chat).
            sustained = min(step.achieved_tps, step.offered_tps)
            if sustained > knee.knee_tps:
                knee.knee_tps = sustained
                knee.knee_p50_ms, knee.knee_p99_ms = step.p50_ms, step.p99_ms
            if fraction == shares[-1] and extra < MAX_EXTRA_STEPS:
                # Still keeping up at the last share: the probe underestimated, so the
                # knee lies further on.
                extra += 1
                shares.append(fraction * 1.25)
        elif not knee.knee_tps and fraction == min(shares):
            # Not even the lowest share kept up: the probe overestimated (a burst that a
            # closed loop reaches and an open one cannot hold, or a machine busier since,
            # as beside other work). Halve the share rather than report no knee.
            if extra >= MAX_EXTRA_STEPS:
                break
            extra += 1
            del shares[shares.index(fraction) + 1 :]
            shares.append(fraction / 2)
        else:
            over += 1
            if over >= 2:  # past the knee twice: enough
                break
    if half_knee and knee.knee_tps:
        knee_rps = max(s.achieved_rps for s in knee.steps if kept_up(s, p99_bound))
        async with load.client() as client:
            half = await load.step(client, 0.5 * knee_rps, step_seconds)
        knee.p50_at_half_knee_ms = half.p50_ms
    return knee
