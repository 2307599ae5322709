"""What `shoal tune` shows while it runs, on stderr: a line per phase (the quality check,
the stack starting, the model loading, a worker restart, the search, the confirm runs)
and one per trial: its candidate, its figure, the best so far and the budget left.

On a terminal a bar under those lines is redrawn in place once a second (the budget
left, the phase, the best so far); whatever else writes to stderr meanwhile (log records,
warnings, a library's loading bar) goes above it, a whole line at a time. Elsewhere (CI,
a pipe, a file) only the lines are written. The report (the table, the winner, the report
path) goes to stdout, so `shoal tune ... > report.txt` keeps it apart from the progress.
"""

from __future__ import annotations

import logging
import shutil
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

from .search import Trial

__all__ = ["Progress", "budget_left", "duration"]

_BAR_WIDTH = 20
_CLEAR = "\r\033[K"  # to the line's start, then erase it


def duration(seconds: float) -> str:
    """`45s`, `4m12s`, `10m`, `1h02m05s`: whole seconds; zero parts at either end left out."""
    hours, rest = divmod(max(0, round(seconds)), 3600)
    parts = [(hours, "h"), *zip(divmod(rest, 60), "ms", strict=True)]
    while len(parts) > 1 and parts[0][0] == 0:
        parts.pop(0)
    while len(parts) > 1 and parts[-1][0] == 0:
        parts.pop()
    (first, unit), *others = parts
    return f"{first}{unit}" + "".join(f"{n:02d}{u}" for n, u in others)


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."


def budget_left(elapsed: float, budget: float) -> str:
    """`4m12s of 10m left`, or `12s past the 10m budget` once it is spent."""
    left = budget - elapsed
    if left >= 0:
        return f"{duration(left)} of {duration(budget)} left"
    return f"{duration(-left)} past the {duration(budget)} budget"


class Progress:
    """The lines (and on a terminal, the bar) of one `shoal tune` run; use it as a context
    manager, and pass `phase` and `trial` to `tune` as its callbacks."""

    def __init__(
        self,
        budget_s: float,
        unit: str,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = 1.0,
    ) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.budget_s, self.unit, self.clock, self.tick_s = budget_s, unit, clock, tick_s
        self.started = clock()
        self.best: float | None = None
        self.trials = 0
        self.doing = "starting"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._handlers: list[tuple[logging.StreamHandler, TextIO]] = []
        self._above: _AboveBar | None = None

    def left(self) -> str:
        return budget_left(self.clock() - self.started, self.budget_s)

    def phase(self, text: str) -> None:
        """A line for a phase that starts now (e.g. `loading MODEL in the worker`)."""
        self.doing = text
        self._line(f"shoal tune: {text} · {self.left()}")

    def trial(self, trial: Trial) -> None:
        self._line(self.trial_text(trial))

    def trial_text(self, trial: Trial) -> str:
        """`[ 3] coarse max_batch_items=32 threads=2: 1830.0 texts/s, p99 420 ms (best
        1910.0) · 4m12s of 10m left`; numbered from 0 (the default), as the table is."""
        number, self.trials = self.trials, self.trials + 1
        knobs = " ".join(f"{k}={v}" for k, v in trial.candidate.items())
        if isinstance(trial.detail, BaseException):  # whole in the JSON report
            figure = f"failed: {_cut(repr(trial.detail), 160)}"
        else:
            figure = f"{trial.score:.1f} {self.unit}/s"
            p99 = getattr(trial.detail, "knee_p99_ms", None)
            figure += f", p99 {p99:.0f} ms" if p99 is not None else ""
        if trial.score > 0 and (self.best is None or trial.score > self.best):
            self.best, best = trial.score, "new best"
        else:
            best = "no figure yet" if self.best is None else f"best {self.best:.1f}"
        return f"[{number:2d}] {trial.phase} {knobs}: {figure} ({best}) · {self.left()}"

    def bar(self, width: int = 0) -> str:
        """`[#####...............] 7m31s of 10m left · loading MODEL · best 1910.0
        texts/s`, cut to `width` (0: the terminal's) so that `\\r` can redraw it."""
        share = min(1.0, max(0.0, (self.clock() - self.started) / (self.budget_s or 1)))
        filled = round(share * _BAR_WIDTH)
        text = f"[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {self.left()} · {self.doing}"
        if self.best is not None:
            text += f" · best {self.best:.1f} {self.unit}/s"
        return text[: (width or shutil.get_terminal_size().columns) - 1]

    def _line(self, text: str) -> None:
        self._write(text + "\n")

    def _write(self, text: str) -> None:
        """`text` (whole lines), above the bar on a terminal."""
        with self._lock:
            self.stream.write(f"{_CLEAR}{text}{self.bar()}" if self.tty else text)
            self.stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(self.tick_s):
            with self._lock:
                self.stream.write(_CLEAR + self.bar())
                self.stream.flush()

    def __enter__(self) -> Progress:
        if self.tty:
            self._above = _AboveBar(self)
            for handler in logging.getLogger().handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream is self.stream:
                    self._handlers.append((handler, handler.setStream(self._above)))
            if sys.stderr is self.stream:
                sys.stderr = self._above
            self._ticker = threading.Thread(target=self._tick, name="tune-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        for handler, stream in self._handlers:
            handler.setStream(stream)
        if sys.stderr is self._above:
            sys.stderr = self.stream
        if self.tty:  # the report follows on a clean line
            pending = self._above.pending if self._above else ""
            self.stream.write(_CLEAR + pending)
            self.stream.flush()


class _AboveBar:
    """sys.stderr (and a log handler's stream) while the bar is drawn: whole lines go
    above the bar; a partial one (a `\\r`-redrawn loading bar) waits for its end."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.pending = ""

    def write(self, text: str) -> int:
        lines, newline, self.pending = (self.pending + text).rpartition("\n")
        if newline:
            self.progress._write(lines + newline)
        return len(text)

    def flush(self) -> None:
        self.progress.stream.flush()

    def __getattr__(self, name: str) -> object:  # isatty, fileno, encoding: the terminal's
        return getattr(self.progress.stream, name)
