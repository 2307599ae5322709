"""How long new work for a model would wait: its queue depth over its drain rate.

A bounded stream refuses work only when it is full; long before that, a model whose
workers cannot keep up builds a backlog that new requests would sit behind until their
deadline. The gateway watches, for each model it recently sent live work to, the model's
consumer: items waiting (`num_pending` + `num_ack_pending`) and items finished per second
(deliveries less unacked ones, their growth smoothed). A request that would wait longer than its
deadline is refused at once (503 with `Retry-After`) instead of queued to time out.

The numbers come from JetStream, so they count every gateway's work, not this one's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from .errors import QueueUnavailableError
from .nats import Bus
from .subjects import Subjects

__all__ = ["BacklogMonitor"]

log = logging.getLogger(__name__)

_POLL = 0.5
"""Seconds between looks at each active model's consumer."""
_ACTIVE = 30.0
"""A model is watched while it had live work within this many seconds."""
_SMOOTHING = 0.3
"""Weight of the newest drain-rate sample (an exponential moving average)."""
_MIN_BACKLOG = 8
"""Below this many waiting items there is no backlog to speak of."""
_STALLED = 5.0
"""A queue that has not moved for this long has no drain rate to speak of (its workers
are loading, restarting or gone): no estimate, so deadlines and the no-worker policy
decide, not a rate measured before."""


class _Model:
    __slots__ = (
        "finished",
        "first_sample",
        "last_request",
        "pending",
        "progress_at",
        "rate",
        "unrun",
        "warming",
    )

    def __init__(self, now: float) -> None:
        self.last_request = now
        self.pending = 0
        self.rate = 0.0
        """Items finished per second while the queue moves; 0 until measured (from two
        samples)."""
        self.first_sample: float | None = None
        self.finished = -1
        self.progress_at = now
        """When `finished` last grew (or the queue was last empty)."""
        self.warming = True
        """Until the first growth is seen: that sample spans the wait for the first batch,
        not a drain rate, so it is skipped."""
        self.unrun = 0
        """Items this gateway cancelled whose acks are still to come: workers ack them
        unrun, which reads as finished with no work done, so they are not counted."""


class BacklogMonitor:
    """Estimates how long each model's queue takes to drain, from JetStream's counts."""

    def __init__(
        self,
        bus: Bus,
        stream: str,
        subjects: Subjects,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._bus = bus
        self._stream = stream
        self._subjects = subjects
        self._clock = clock
        self._models: dict[str, _Model] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._poll_forever())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def wait_for(self, model: str) -> float:
        """Seconds a new live item for `model` would wait before a worker finishes it;
        0 when there is no backlog or it cannot be told yet. Marks the model active."""
        now = self._clock()
        state = self._models.get(model)
        if state is None:
            self._models[model] = _Model(now)
            return 0.0
        state.last_request = now
        if state.pending < _MIN_BACKLOG or state.rate <= 0:
            return 0.0
        if now - state.progress_at > _STALLED:
            return 0.0
        return state.pending / state.rate

    def admitted(self, model: str, items: int) -> None:
        """This gateway just queued `items` for the model: count them now, since under a
        burst many requests are admitted between two polls."""
        state = self._models.get(model)
        if state is not None:
            state.pending += items

    def discount(self, model: str, items: int) -> None:
        """`items` of the model's backlog were cancelled: workers will drop them unrun.
        Until the next poll sees it, count them out."""
        state = self._models.get(model)
        if state is not None:
            state.pending = max(0, state.pending - items)
            state.unrun += items

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(_POLL)
            now = self._clock()
            for model, state in list(self._models.items()):
                if now - state.last_request > _ACTIVE:
                    del self._models[model]
                    continue
                try:
                    await self._poll(model, state)
                except Exception:  # an estimate is advice: never let it stop watching
                    log.exception("backlog poll of %s failed", model)

    async def _poll(self, model: str, state: _Model) -> None:
        consumer = self._subjects.consumer("interactive", model)
        try:
            [info] = await self._bus.consumer_states(self._stream, consumer)
        except QueueUnavailableError as exc:
            log.debug("backlog of %s unknown: %r", model, exc)
            return  # no worker made the consumer yet, or NATS is away: no estimate
        now = self._clock()
        state.pending = info.pending + info.ack_pending
        # Items finished so far: deliveries less those still unacked (a redelivery counts
        # twice, a small overcount). Not the ack floor: batches ack out of order, and the
        # floor only moves when the oldest delivery is acked.
        finished = max(0, info.delivered - info.ack_pending)
        if state.finished < 0 or finished < state.finished:  # first look, or a new consumer
            state.finished, state.progress_at = finished, now
            return
        if finished > state.finished:
            moved = finished - state.finished
            done = max(0, moved - state.unrun)
            state.unrun = max(0, state.unrun - moved)
            if done and (state.warming or now - state.progress_at > _STALLED):
                # Its window began before the first batch did, or spans a stall (workers
                # gone or loading): not a drain rate. Read as one, the first batch of a
                # worker that replaced a dead one dragged the rate so low that requests
                # were refused behind a backlog that drained in seconds.
                state.warming = False
            elif done:
                # Over the time since it last grew, so polls that fall between two
                # slow batches average in instead of reading as a zero rate.
                sample = done / max(now - state.progress_at, 1e-3)
                if state.rate > 0:
                    state.rate = _SMOOTHING * sample + (1 - _SMOOTHING) * state.rate
                elif state.first_sample is None:
                    # One sample is no rate yet: it may span a gap just short of a stall
                    # (a replacement worker loading in under `_STALLED`; ~10 items over
                    # 4.8 s refused requests behind a queue that drained in seconds).
                    state.first_sample = sample
                else:  # the faster of the first two: an estimate errs toward admitting
                    state.rate = max(state.first_sample, sample)
            state.finished, state.progress_at = finished, now
        elif state.pending == 0:
            state.progress_at = now  # idle is not stalled
