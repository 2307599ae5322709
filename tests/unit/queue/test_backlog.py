"""The backlog estimate (queue depth over drain rate) across a stall: a worker killed
and replaced must not leave a drain rate measured over the time nobody worked.

JetStream's consumer info is replayed by a stand-in bus (the states a real consumer
reported are plain numbers; tests/integration/test_queue_semantics.py runs the monitor
against a real nats-server)."""

from __future__ import annotations

from shoal.queue.backlog import BacklogMonitor
from shoal.queue.nats.bus import ConsumerState
from shoal.queue.subjects import Subjects

MODEL = "m"


class ConsumerInfoReplay:
    """Stands in for the Bus: answers `consumer_states` with the state set last."""

    def __init__(self) -> None:
        self.state = ConsumerState("c", "s", pending=0, ack_pending=0, delivered=0)

    def set(self, pending: int, ack_pending: int, delivered: int) -> None:
        self.state = ConsumerState("c", "s", pending, ack_pending, delivered)

    async def consumer_states(self, stream: str, consumer: str = "") -> list[ConsumerState]:
        return [self.state]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _poll(monitor: BacklogMonitor, clock: Clock, after: float) -> None:
    clock.now += after
    await monitor._poll(MODEL, monitor._models[MODEL])


async def test_a_stall_is_not_read_as_a_slow_drain_rate() -> None:
    """The first worker dies before any drain rate is measured (its first batch only ends
    the warm-up); after the stall a new worker's first batch spans the stall, not a rate:
    read as one, ~10 items over 12.5 s made a 270 s wait and refused requests whose
    deadline was 120 s behind a backlog that drained in ~11 s."""
    bus, clock = ConsumerInfoReplay(), Clock()
    monitor = BacklogMonitor(bus, "WORK", Subjects(), clock=clock)
    assert monitor.wait_for(MODEL) == 0.0  # first sight: watched from now on
    bus.set(200, 16, 16)
    await _poll(monitor, clock, 0.5)  # first look
    bus.set(200, 16, 26)
    await _poll(monitor, clock, 0.5)  # its first batch: the warm-up, no rate yet
    # It dies: nothing moves for 12 s; then a new worker, once loaded, finishes 10.
    await _poll(monitor, clock, 12.0)
    bus.set(200, 16, 36)
    await _poll(monitor, clock, 0.5)
    assert monitor.wait_for(MODEL) == 0.0  # still no estimate: nothing refused for it
    # Its next batches are a rate (from two samples): 10 items per 0.5 s, ~196 waiting.
    bus.set(190, 16, 46)
    await _poll(monitor, clock, 0.5)
    bus.set(180, 16, 56)
    await _poll(monitor, clock, 0.5)
    assert 8 < monitor.wait_for(MODEL) < 14, monitor.wait_for(MODEL)


async def test_a_gap_just_short_of_a_stall_is_not_read_as_a_slow_drain_rate() -> None:
    """As above, but the new worker answers 4.8 s after the last progress, under the
    stall bound: that one growth spans the load, not a drain rate. Read as the first rate
    (10 items over 4.8 s, ~2/s) it refused requests with a 120 s deadline behind ~216
    items that drained in ~11 s (seen once in a full run: test_worker_crash)."""
    bus, clock = ConsumerInfoReplay(), Clock()
    monitor = BacklogMonitor(bus, "WORK", Subjects(), clock=clock)
    monitor.wait_for(MODEL)
    bus.set(200, 16, 16)
    await _poll(monitor, clock, 0.5)  # first look
    bus.set(200, 16, 26)
    await _poll(monitor, clock, 0.5)  # the first worker's first batch: the warm-up
    await _poll(monitor, clock, 4.3)  # it died: nothing moves for 4.8 s in all
    bus.set(200, 16, 36)
    await _poll(monitor, clock, 0.5)
    assert monitor.wait_for(MODEL) == 0.0  # one sample: no estimate, nothing refused
    bus.set(190, 16, 46)
    await _poll(monitor, clock, 0.5)  # the next: 10 items per 0.5 s, ~206 waiting
    assert 8 < monitor.wait_for(MODEL) < 14, monitor.wait_for(MODEL)
