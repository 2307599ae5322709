"""Starting and stopping: waiting for what is not ready yet, and stopping on a signal in
every phase.

Every Shoal process keeps one promise: SIGINT or SIGTERM ends it within `STOP_WITHIN`
seconds, whatever it is doing (connecting, provisioning, loading a model, serving,
draining), and nothing it accepted is lost (work in hand is nak'ed, or left unacked for
redelivery). The pieces:

- `StopSignals`: the first signal sets an event the process watches and arms a
  last-resort exit; a second signal exits at once;
- `retry_until_ready`: the one retry loop for "until it answers" (NATS accepting
  connections, JetStream answering admin requests while a cluster elects), bounded in
  time, with backoff, and cancellable at any await: a stop cancels it;
- `run_until_stopped`: runs a process's main coroutine; a stop before it is serving
  cancels it at once, a stop while serving gives it `DRAIN_SECONDS` to finish what it
  holds, then cancels it;
- `exit_leaving_threads`: a thread still busy at exit (a model converting, a server
  starting) is not waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = [
    "DRAIN_SECONDS",
    "STOP_WITHIN",
    "StopSignals",
    "Stopped",
    "die_with_parent",
    "exit_leaving_threads",
    "retry_until_ready",
    "run_until_stopped",
    "unless_stopped",
]

log = logging.getLogger("shoal.lifecycle")
T = TypeVar("T")

STOP_WITHIN = 10.0
"""Seconds from SIGINT/SIGTERM to exit, promised by every process."""
DRAIN_SECONDS = 4.0
"""How long a serving process finishes work in hand after a stop signal, before it
returns the rest to the queue. `shoal serve` stops gateways, then workers: two drains
and their clean-up fit in `STOP_WITHIN`."""
_LAST_RESORT = 9.0
"""Seconds after the first signal at which a process that has not exited exits anyway
(with status 1): whatever it held is unacked and JetStream redelivers it."""

_PR_SET_PDEATHSIG = 1
try:  # resolved here, not in the forked child, where loading a library could deadlock
    _prctl: Callable[..., int] | None = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the ordered shutdowns still apply
    _prctl = None


def die_with_parent() -> None:
    """For `preexec_fn`: the child gets SIGTERM when the thread that started it ends
    (Linux' PR_SET_PDEATHSIG: the *thread*, so start children from a long-lived one)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _exit_now(status: int, why: str, stacks: bool = False) -> None:
    """Exit at once; `stacks`: first write every thread's stack to stderr, so a stop
    that hung says where."""
    log.warning("%s; exiting now", why)
    if stacks:
        with contextlib.suppress(Exception):
            faulthandler.dump_traceback(sys.stderr, all_threads=True)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


class StopSignals:
    """SIGINT and SIGTERM for one asyncio process.

    The first signal sets `event` (the process stops in its own way) and arms a timer
    that exits the process `last_resort` seconds later if it is still there; a second
    signal exits at once (Ctrl-C twice).
    """

    def __init__(self, last_resort: float = _LAST_RESORT) -> None:
        self.event = asyncio.Event()
        self.last_resort = last_resort
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: threading.Timer | None = None

    @property
    def stopping(self) -> bool:
        return self._timer is not None

    def install(self) -> StopSignals:
        """Handle both signals for the running loop. With `signal.signal`, not the loop's
        own handlers: those run only when the loop runs, and a second Ctrl-C must work
        even when something blocks it."""
        self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, _frame: self.trip(signum))
        return self

    def trip(self, signum: int = signal.SIGTERM) -> None:
        """What a signal does (also for handlers installed elsewhere, e.g. uvicorn's).
        Safe to call from a signal handler or another thread."""
        name = signal.Signals(signum).name
        if self._timer is not None:
            _exit_now(1, f"second {name}")
        log.info("%s: stopping (within %.0fs)", name, STOP_WITHIN)
        self._timer = threading.Timer(
            self.last_resort,
            _exit_now,
            (1, f"still running {self.last_resort:g}s after {name}", True),
        )
        self._timer.daemon = True
        self._timer.start()
        loop = self._loop or _running_loop()
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.event.set)
        else:
            self.event.set()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class Stopped(Exception):
    """A stop signal came while this was waiting."""


async def _done_or_stopped(task: asyncio.Future, stop: asyncio.Event) -> None:
    """Wait until `task` is done or `stop` is set, whichever comes first."""
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()


async def unless_stopped(awaitable: Awaitable[T], stop: asyncio.Event) -> T:
    """`awaitable`'s result, or, once `stop` is set first, `Stopped` (the awaitable is
    cancelled)."""
    task = asyncio.ensure_future(awaitable)
    try:
        await _done_or_stopped(task, stop)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise Stopped()
    return task.result()


async def retry_until_ready(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    retry_on: tuple[type[BaseException], ...],
    within: float,
    first_delay: float = 0.2,
    max_delay: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`await call()` until it returns, retrying what `retry_on` names with backoff
    (`first_delay` doubling up to `max_delay`) for at most `within` seconds.

    A stop cancels it at whatever it awaits (an attempt or the pause between two).
    Failures are logged at the first and then every ten seconds, not every attempt.

    Raises:
        The last `retry_on` error, once `within` seconds have passed.
    """
    started = clock()
    delay = first_delay
    logged_at = -1e9
    while True:
        try:
            return await call()
        except retry_on as exc:
            waited = clock() - started
            if waited + delay > within:
                log.warning("%s: not ready after %.0fs: %r", what, waited, exc)
                raise
            if clock() - logged_at >= 10.0:
                log.info("%s: not ready yet (%r); retrying for up to %.0fs", what, exc, within)
                logged_at = clock()
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay)


async def run_until_stopped(
    main: Coroutine[Any, Any, None],
    stop: asyncio.Event,
    serving: Callable[[], bool],
    drain: float = DRAIN_SECONDS,
) -> None:
    """Run `main`, which returns by itself once `stop` is set and it has drained.

    A stop while `serving()` is false (connecting, provisioning, loading) cancels `main`
    at once; while serving, `main` gets `drain` seconds and one more for its clean-up,
    then it is cancelled.
    """
    task = asyncio.ensure_future(main)
    await _done_or_stopped(task, stop)
    if not task.done():
        if serving():
            await asyncio.wait({task}, timeout=drain + 1.0)
        if not task.done():
            log.info("stopping before it finished starting" if not serving() else "drain cut off")
            task.cancel()
        try:
            await asyncio.wait_for(task, 2.0)
        except asyncio.CancelledError:
            pass
        except TimeoutError:
            log.warning("clean-up did not finish in time; leaving it")
        return
    task.result()


def exit_leaving_threads(status: int = 0) -> None:
    """End the process without waiting for threads still busy (a model loading or
    converting, a child server starting): Python would join them at exit, for as long
    as they take. Call it last, once everything that must be saved is saved."""
    busy = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and t.is_alive() and not t.daemon
    ]
    if busy:
        _exit_now(status, f"leaving busy threads behind: {', '.join(busy)}")
