"""When an encoder worker pulls, which batch it runs next, how much of it and on how many
threads: a pure policy over the worker's models, on an injected clock.

The worker (worker.py) keeps the asyncio plumbing: it tells the policy what happened
(`live_arrived`, `started`, `computed`, `ended`) and asks it what to do (`room`, `next`,
`pull_delay`). Nothing here awaits, sleeps or reads the time but through `clock`, so the
rules run the same under unit tests on a fake clock as in the worker.

The rules:
- room: live work is pulled while the worker holds fewer than `max_held_jobs` jobs, the
  model has fewer than `POOL_BATCHES` batches of live inputs queued, and no pass that
  leaves no room beside it runs beyond `PULL_HORIZON`; batch-lane work only while no live
  work is pending, a few items at a time while live traffic is about;
- next: the batch due soonest on a resident model, live before batch lane (a batch job
  fills spare capacity and never makes a live request wait its turn); whether it runs
  alone or beside another pass is the `PassPlanner`'s;
- size: a live batch alone takes the batcher's whole token budget, beside another pass
  half of it; a batch-lane batch takes what the model runs in one slice of
  `batch_slice_ms` while live traffic is about (on half the threads), `IDLE_SLICES`
  slices otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

from .model import BatcherKey, EncoderModel
from .passes import Pass, PassPlanner

__all__ = ["PULL_HORIZON", "EncoderSchedule", "Run"]

POOL_BATCHES = 4
"""Live inputs queued per model, in batches: enough for the batcher to group by length."""
PULL_HORIZON = 0.005
"""Seconds before its forward pass is expected to end from which a busy worker pulls live
work again. A pull waiting on a busy worker takes the next request from the shared queue
even while another worker is idle, and the request waits behind the whole pass: with
Shoal's pull on 4 to 32 workers, that kept the knee at the push round-robin router's
(perf/scale/README.md). Pulling only when about to be free sends work to whoever can
start it first (a fetch takes well under this horizon on a local nats-server)."""
LIVE_TRAFFIC_HORIZON = 2.0
"""Seconds after a live arrival during which batch-lane work yields to it."""
IDLE_SLICES = 10
"""With no live traffic about, a batch-lane forward may take this many slices: it bounds
what the first live request to arrive waits for (on a CPU, batches past a few inputs
hardly gain throughput; on a GPU, ten slices are a large batch)."""
BATCH_LANE_LIVE_FETCH = 2
"""Batch-lane items pulled at a time while live traffic is about (each is tokenized on
the thread live work is tokenized on)."""


@dataclass(frozen=True)
class Run:
    """A decision: run a batch from `model`'s batcher `key` now."""

    model: EncoderModel
    key: BatcherKey
    mode: Pass
    share: float
    """Of the batcher's token budget, what the batch may take (0: one input)."""
    threads: int
    """Intra-op threads for the pass."""


class EncoderSchedule:
    """The encoder worker's scheduling rules over `models` (the worker's own mapping,
    read, never changed here) and the passes it reports."""

    def __init__(
        self,
        models: Mapping[str, EncoderModel],
        clock: Callable[[], float],
        *,
        full_threads: int,
        pairs: bool,
        max_held_jobs: int,
        batch_slice_ms: float,
        pull_horizon: float | None = PULL_HORIZON,
    ) -> None:
        """`full_threads`: the intra-op threads of a pass alone; `pairs`: whether two
        passes may run side by side at all (a CPU with two threads or more);
        `pull_horizon`: None pulls live work whatever runs (the scale simulator's
        `pull-anytime`, the rule before PULL_HORIZON)."""
        self._models = models
        self._clock = clock
        self.full_threads = full_threads
        self.max_held_jobs = max_held_jobs
        self.batch_slice_ms = batch_slice_ms
        self.pull_horizon = pull_horizon
        self.passes = PassPlanner(clock, pairs=pairs)
        self._running: dict[Hashable, float] = {}
        """The forward passes computing, each with when it is expected to end (clock time).
        A pass leaves it when its forward ends (pulls go on), and leaves the planner once
        its answers are sent (so the next pass is chosen once the pulls that this let in
        had their time, as live work must not find a batch-lane pass just started)."""
        self._last_live = -math.inf

    # Events ------------------------------------------------------------------------------

    def live_arrived(self) -> None:
        """Live jobs were accepted now."""
        self._last_live = self._clock()

    def started(self, token: Hashable, run: Run, padded_tokens: int) -> None:
        """The pass `token` began on `run` with a batch of `padded_tokens`."""
        self.passes.started(run.mode)
        per_token = run.model.seconds_per_token or math.inf
        alone = per_token * padded_tokens
        self._running[token] = self._clock() + alone * (2 if run.mode is Pass.BESIDE else 1)

    def computed(self, token: Hashable, mode: Pass) -> bool:
        """The pass `token`'s forward is over (or it ended before one); whether another
        pass is still computing (its horizon now decides when pulls go on)."""
        if self._running.pop(token, None) is None:
            return False
        self.passes.computed(mode)
        return bool(self._running)

    def ended(self, mode: Pass) -> None:
        """A pass's answers are sent: it leaves its place."""
        self.passes.ended(mode)

    # Decisions ---------------------------------------------------------------------------

    def room(self, model: str, batch_lane: bool, held: int, held_batch_lane: int) -> int:
        """How many jobs for `model` to pull now, the worker holding `held` jobs of which
        `held_batch_lane` from the batch lane (read for batch-lane room only)."""
        served = self._models.get(model)
        if served is None:
            return 0
        if not batch_lane:
            # Only live work counts here: batch-lane work never keeps live work unpulled.
            if served.interactive_queued >= POOL_BATCHES * served.spec.profile.max_batch_items:
                return 0
            if self.about_to_be_busy():
                return 0
            return max(0, self.max_held_jobs - held)
        # Batch lane: none while any live work is pending on this worker, and never more
        # than half the held-job slots or about two batches of inputs, so live work
        # always finds room.
        if any(other.interactive_queued for other in self._models.values()):
            return 0
        live = self.live_traffic_about()
        if live and self._running:
            # Pulled now, it would be due when this pass ends, racing the live work that
            # the pull horizon lets in just before: pulled once the pass has ended instead.
            return 0
        if served.batch_queued() >= 2 * served.spec.profile.max_batch_items:
            return 0
        most = BATCH_LANE_LIVE_FETCH if live else 16
        room = min(self.max_held_jobs // 2 - held_batch_lane, self.max_held_jobs - held, most)
        return max(0, room)

    def next(self) -> Run | float | None:
        """The batch to run now; else the clock time at which one will be due, or None
        to wait for an event (work arriving, a pass ending)."""
        due, wake_at = self._next_due()
        if due is None:
            return wake_at
        model, key = due
        mode = self.passes.next(self._may_pair(model, key))
        if mode is None:  # it waits for a running pass, whose end is an event
            return None
        threads = self.threads(model)
        share = 1.0
        if key.batch_lane:
            live = self.live_traffic_about()
            share = self._batch_slice_share(model, key, 1 if live else IDLE_SLICES)
            if live:  # leave half the cores to the live path while it is busy
                threads = max(1, threads // 2)
        elif mode is Pass.BESIDE:
            # On half the threads: half the tokens end it about when a full batch alone
            # would, so a request does not wait twice as long behind it.
            share = 0.5
        return Run(model, key, mode, share, threads)

    def pull_delay(self) -> float | None:
        """When pulls may go on: 0.0 now; else in that many seconds (the running passes
        about to end); None: at an event (a pass not yet measured ends, a due pass starts)."""
        if not self.about_to_be_busy():
            return 0.0
        soonest = min(self._running.values(), default=math.inf)
        if soonest == math.inf:
            return None
        return max(0.0, soonest - (self.pull_horizon or 0.0) - self._clock())

    def about_to_be_busy(self) -> bool:
        """Whether the passes computing end beyond `PULL_HORIZON` with no room for another
        beside them, or none computes and a live batch is due (its pass starts before a
        pull could bring more)."""
        if self.pull_horizon is None:
            return False
        if self._running:
            if self.passes.has_room():
                return False
            return min(self._running.values()) - self._clock() > self.pull_horizon
        due, _ = self._next_due()
        return due is not None and not due[1].batch_lane

    def live_traffic_about(self) -> bool:
        return self._clock() - self._last_live < LIVE_TRAFFIC_HORIZON

    def threads(self, model: EncoderModel) -> int:
        """The intra-op threads of `model`'s live passes (alone, or shared by two)."""
        return model.spec.profile.threads or self.full_threads

    @property
    def computing(self) -> int:
        return len(self._running)

    # Rules -------------------------------------------------------------------------------

    def _next_due(self) -> tuple[tuple[EncoderModel, BatcherKey] | None, float | None]:
        """The batch due soonest on a resident model, if due now; else when one will be.
        Batch-lane work runs only when no live work is pending at all."""
        for batch_lane in (False, True):
            best: tuple[float, EncoderModel, BatcherKey] | None = None
            for model in self._models.values():
                if model.state != "resident":
                    continue
                for key, batcher in model.batchers.items():
                    if key.batch_lane != batch_lane:
                        continue
                    at = batcher.ready_at()
                    if at is not None and (best is None or at < best[0]):
                        best = (at, model, key)
            if best is None:
                continue
            if best[0] <= self._clock():
                return (best[1], best[2]), None
            return None, best[0]
        return None, None

    def _may_pair(self, model: EncoderModel, key: BatcherKey) -> bool:
        """Whether the batch due may run beside another pass: live work, on an engine and
        op that allow it, with at least a thread per stream."""
        return (
            not key.batch_lane
            and self.threads(model) >= 2
            and model.adapter.runs_side_by_side(key.op, key.lora)
        )

    def _batch_slice_share(self, model: EncoderModel, key: BatcherKey, slices: int) -> float:
        """The share of the token budget a batch-lane forward may take: as many tokens as
        the model runs in `slices` x `batch_slice_ms` (from its measured cost per token),
        so a live request that arrives during one waits for a short forward pass, not a
        full one. Until measured, one input at a time."""
        if model.seconds_per_token <= 0:
            return 0.0
        tokens = slices * self.batch_slice_ms / 1000 / model.seconds_per_token
        return min(1.0, tokens / model.batchers[key].profile.max_batch_tokens)
