"""`shoal tune`'s progress on stderr: the budget left, the best so far, plain lines off a
terminal and a bar redrawn in place on one."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from shoal.tune.knee import Knee
from shoal.tune.progress import Progress, budget_left, duration
from shoal.tune.search import Trial

NO_TICK = 3600.0
"""The bar is redrawn at each line only: a tick would add a redraw whenever it came."""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_durations_read_like_the_budgets_given() -> None:
    assert [duration(s) for s in (0, 0.4, 45, 60, 61, 252, 600, 3600, 3605, 3725, 5400)] == [
        "0s", "0s", "45s", "1m", "1m01s", "4m12s", "10m", "1h", "1h00m05s", "1h02m05s", "1h30m"
    ]  # fmt: skip
    assert duration(-5) == "0s"


def test_budget_left_and_past() -> None:
    assert budget_left(348, 600) == "4m12s of 10m left"
    assert budget_left(0, 90) == "1m30s of 1m30s left"
    assert budget_left(600, 600) == "0s of 10m left"
    assert budget_left(612, 600) == "12s past the 10m budget"


def knee(tps: float, p99: float | None = 420.0) -> Knee:
    return Knee(knee_tps=tps, knee_p99_ms=p99)


def two_threads(phase: str, items: int, score: float, detail: object) -> Trial:
    return Trial({"max_batch_items": items, "threads": 2}, score, detail, 9.0, phase)


def test_plain_lines_off_a_terminal_with_the_best_so_far() -> None:
    clock, out = Clock(), io.StringIO()
    with Progress(600, "texts", out, clock=clock) as progress:
        progress.phase("starting nats-server, a gateway and a worker for m")
        clock.now += 30
        progress.trial(two_threads("default", 32, 1830.0, knee(1830.0)))
        clock.now += 60
        progress.trial(two_threads("coarse", 64, 1910.4, knee(1910.4)))
        clock.now += 162
        progress.trial(two_threads("coarse", 16, 1500.0, knee(1500.0, None)))
        progress.trial(two_threads("refine", 256, 0.0, RuntimeError("oom")))
        clock.now += 400
        progress.phase("measuring the best candidates again")
    assert out.getvalue().splitlines() == [
        "shoal tune: starting nats-server, a gateway and a worker for m · 10m of 10m left",
        "[ 0] default max_batch_items=32 threads=2: 1830.0 texts/s, p99 420 ms (new best)"
        " · 9m30s of 10m left",
        "[ 1] coarse max_batch_items=64 threads=2: 1910.4 texts/s, p99 420 ms (new best)"
        " · 8m30s of 10m left",
        "[ 2] coarse max_batch_items=16 threads=2: 1500.0 texts/s (best 1910.4)"
        " · 5m48s of 10m left",
        "[ 3] refine max_batch_items=256 threads=2: failed: RuntimeError('oom') (best 1910.4)"
        " · 5m48s of 10m left",
        "shoal tune: measuring the best candidates again · 52s past the 10m budget",
    ]
    assert "\r" not in out.getvalue() and "#" not in out.getvalue()


def test_no_best_until_a_trial_measures_something() -> None:
    progress = Progress(60, "tokens", io.StringIO(), clock=Clock())
    failed = Trial({"max_batch_items": 8}, 0.0, TimeoutError("not served"), 60, "default")
    assert progress.trial_text(failed).endswith("(no figure yet) · 1m of 1m left")
    assert progress.best is None
    crashed = Trial({"max_batch_items": 16}, 0.0, RuntimeError("the worker exited:\n" + "x" * 999))
    line = progress.trial_text(crashed)
    assert "\n" not in line and len(line) < 250
    assert line.startswith(
        "[ 1]  max_batch_items=16: failed: RuntimeError('the worker exited:\\nxx"
    )


def test_a_terminal_gets_a_bar_redrawn_in_place_and_logs_above_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    clock, out = Clock(), Terminal()
    handler = logging.StreamHandler(out)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [handler])  # as configure_logging leaves it
    with Progress(600, "texts", out, clock=clock, tick_s=NO_TICK) as progress:
        clock.now += 150
        progress.phase("loading m in the worker (until it answers)")
        logging.getLogger("shoal.test").warning("a log record")
        progress.trial(Trial({"max_batch_items": 32}, 1830.0, knee(1830.0), 9, "default"))
        assert handler.stream is not out  # records go above the bar while it is drawn
    assert handler.stream is out
    text = out.getvalue()
    assert text.endswith("\r\033[K")  # the bar is wiped before the report
    bar = "[#####...............] 7m30s of 10m left · loading m in the worker (until it answers)"
    line = "shoal tune: loading m in the worker (until it answers) · 7m30s of 10m left"
    assert f"\r\033[K{line}\n{bar}" in text
    assert f"\r\033[Ka log record\n{bar}" in text
    assert "(new best) · 7m30s of 10m left\n" + bar + " · best 1830.0 texts/s" in text


def test_what_else_writes_to_stderr_goes_above_the_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    out = Terminal()
    monkeypatch.setattr(sys, "stderr", out)  # the terminal the bar is drawn on
    with Progress(600, "texts", clock=Clock(), tick_s=NO_TICK):
        assert sys.stderr is not out and sys.stderr.isatty()
        sys.stderr.write("\rLoading:  50%")  # a library's own bar, redrawn with \r
        assert "Loading" not in out.getvalue()  # a partial line waits for its end
        sys.stderr.write("\rLoading: 100%\n")
        print("a warning", file=sys.stderr)
    assert sys.stderr is out
    bar = "[....................] 10m of 10m left · starting"
    assert out.getvalue() == (
        f"\r\033[K\rLoading:  50%\rLoading: 100%\n{bar}\r\033[Ka warning\n{bar}\r\033[K"
    )


@pytest.mark.parametrize("width", [30, 80])
def test_the_bar_fits_the_terminal(width: int) -> None:
    progress = Progress(600, "texts", Terminal(), clock=Clock())
    progress.doing = "loading a-model-with-a-long-name in the worker (until it answers)"
    assert len(progress.bar(width)) == width - 1
