"""shoal.lifecycle: the one retry loop for "until ready", stopping in every phase, and
the last-resort exit (in real processes, with real signals)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from shoal.lifecycle import (
    Stopped,
    StopSignals,
    retry_until_ready,
    run_until_stopped,
    unless_stopped,
)


class Flaky:
    """Fails `failures` times with `error`, then answers."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ready"


async def test_retries_what_it_is_told_to_until_the_call_answers() -> None:
    call = Flaky(3, TimeoutError("not yet"))
    got = await retry_until_ready(
        call, what="thing", retry_on=(TimeoutError,), within=5.0, first_delay=0.01
    )
    assert got == "ready" and call.calls == 4


async def test_gives_up_with_the_last_error_once_its_time_is_spent() -> None:
    call = Flaky(10_000, TimeoutError("never"))
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="never"):
        await retry_until_ready(
            call, what="thing", retry_on=(TimeoutError,), within=0.3, first_delay=0.01,
            max_delay=0.05,
        )  # fmt: skip
    assert time.monotonic() - started < 1.0
    assert call.calls > 3  # it did retry, with backoff capped at max_delay


async def test_an_error_it_was_not_told_to_retry_goes_through_at_once() -> None:
    call = Flaky(1, ValueError("bad config"))
    with pytest.raises(ValueError):
        await retry_until_ready(call, what="thing", retry_on=(TimeoutError,), within=5.0)
    assert call.calls == 1


async def test_a_stop_cancels_the_wait_between_attempts() -> None:
    call = Flaky(10_000, TimeoutError("never"))
    stop = asyncio.Event()
    waiting = retry_until_ready(
        call, what="thing", retry_on=(TimeoutError,), within=3600.0, first_delay=0.05
    )
    asyncio.get_running_loop().call_later(0.2, stop.set)
    started = time.monotonic()
    with pytest.raises(Stopped):
        await unless_stopped(waiting, stop)
    assert time.monotonic() - started < 0.5


async def test_unless_stopped_answers_when_not_stopped() -> None:
    assert await unless_stopped(Flaky(0, TimeoutError())(), asyncio.Event()) == "ready"


class Phases:
    """A process's main: `starting` until `start_for` seconds pass, then serving until
    stop, then draining for `drain_for` seconds (forever with None)."""

    def __init__(self, stop: asyncio.Event, start_for: float, drain_for: float | None) -> None:
        self.stop = stop
        self.start_for = start_for
        self.drain_for = drain_for
        self.serving = False
        self.drained = False
        self.cancelled_in = ""

    async def main(self) -> None:
        try:
            await asyncio.sleep(self.start_for)
            self.serving = True
            await self.stop.wait()
            await asyncio.sleep(3600 if self.drain_for is None else self.drain_for)
            self.drained = True
        except asyncio.CancelledError:
            self.cancelled_in = "serving" if self.serving else "starting"
            raise


async def _stop_after(delay: float, phases: Phases, drain: float = 0.3) -> float:
    asyncio.get_running_loop().call_later(delay, phases.stop.set)
    started = time.monotonic()
    await run_until_stopped(phases.main(), phases.stop, lambda: phases.serving, drain=drain)
    return time.monotonic() - started - delay


async def test_a_stop_while_starting_cancels_at_once() -> None:
    phases = Phases(asyncio.Event(), start_for=3600, drain_for=0)
    assert await _stop_after(0.1, phases) < 0.2
    assert phases.cancelled_in == "starting"


async def test_a_stop_while_serving_lets_it_drain() -> None:
    phases = Phases(asyncio.Event(), start_for=0, drain_for=0.2)
    await _stop_after(0.1, phases)
    assert phases.drained and not phases.cancelled_in


async def test_a_drain_that_does_not_end_is_cut_off() -> None:
    phases = Phases(asyncio.Event(), start_for=0, drain_for=None)
    took = await _stop_after(0.1, phases, drain=0.3)
    assert phases.cancelled_in == "serving"
    assert 0.3 < took < 2.0


async def test_a_main_that_fails_raises() -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await run_until_stopped(broken(), asyncio.Event(), lambda: False)


def test_stop_signals_set_the_event_and_exit_a_stuck_process_in_the_end(tmp_path) -> None:
    """A process that ignores its stop event (a thread busy in C, say) still exits,
    `last_resort` seconds after SIGTERM, with status 1, writing where each thread was
    stuck; a second signal exits at once."""
    script = textwrap.dedent(
        """
        import asyncio, sys, threading
        from shoal.lifecycle import StopSignals

        async def main(last_resort):
            signals = StopSignals(last_resort=last_resort).install()
            print("ready", flush=True)
            await signals.event.wait()
            print("stop seen", flush=True)
            threading.Event().wait()  # stuck: never returns

        asyncio.run(main(float(sys.argv[1])))
        """
    )
    for last_resort, second in ((0.5, False), (30.0, True)):
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(last_resort)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.stdout.readline() == "stop seen\n"
            if second:
                proc.send_signal(signal.SIGINT)
            assert proc.wait(10) == 1
            took = time.monotonic() - started
            assert took < (2.0 if second else last_resort + 2.0)
            if not second:
                assert took >= last_resort
                stderr = proc.stderr.read() if proc.stderr else ""
                assert "still running" in stderr
                assert "in main" in stderr  # the stuck coroutine's frame, from the dump
        finally:
            if proc.poll() is None:
                proc.kill()


def test_stop_signals_trip_is_safe_without_a_loop() -> None:
    signals = StopSignals(last_resort=3600)
    signals.trip(signal.SIGTERM)
    assert signals.event.is_set() and signals.stopping
    assert signals._timer is not None
    signals._timer.cancel()
