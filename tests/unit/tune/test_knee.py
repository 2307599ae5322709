"""The knee against a real HTTP server on loopback whose capacity drops after the probe, as
a machine's does when other work starts beside it (CI once measured no knee at all for
`shoal tune`'s default this way): the probe overestimates, and the knee is found below the
first share rather than reported as none."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from shoal.tune.knee import Load, Step, find_knee, kept_up

FAST_S, SLOW_S = 0.010, 0.050
"""Service time of a request, one at a time: 100/s during the probe, 20/s after it."""
P99_BOUND_S = 1.0


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.one_at_a_time = threading.Lock()
        self.slow = False


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with self.server.one_at_a_time:
            time.sleep(SLOW_S if self.server.slow else FAST_S)
        body = json.dumps({"data": [1]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _SlowsAtTheFirstStep(Load):
    """The load, slowing the server as its first open-loop step starts: the machine got
    busier between the probe and the steps, at a known moment."""

    def __init__(self, server: _Server) -> None:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        super().__init__(url, [{"input": "x"}], 1, lambda answer: len(answer["data"]))
        self.server = server

    async def step(self, client: httpx.AsyncClient, rps: float, seconds: float) -> Step:
        self.server.slow = True
        return await super().step(client, rps, seconds)


@pytest.fixture
def slowing_server() -> Iterator[_Server]:
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_a_probe_that_overestimates_halves_the_load_until_a_step_keeps_up(
    slowing_server: _Server,
) -> None:
    knee = asyncio.run(
        find_knee(
            _SlowsAtTheFirstStep(slowing_server),
            fractions=(0.6, 0.8, 1.0),
            step_seconds=1.5,
            p99_bound=P99_BOUND_S,
            probe_seconds=0.6,
            warmup_seconds=0.3,
            half_knee=False,
        )
    )
    first = knee.steps[0]
    # The scenario holds: the probe saw the fast server, its first share the slow one.
    assert knee.capacity_rps > 1.5 / SLOW_S, knee.capacity_rps
    assert not kept_up(first, P99_BOUND_S), first
    # Each step below the first offered half the one before, until one kept up; nothing
    # above the first share was tried, since it had not kept up.
    offered = [s.offered_rps for s in knee.steps]
    kept = [kept_up(s, P99_BOUND_S) for s in knee.steps]
    assert True in kept, knee.steps
    below = offered[: kept.index(True) + 1]
    assert below == pytest.approx([offered[0] / 2**i for i in range(len(below))]), offered
    # The knee is what a step that kept up sustained: below the first share, and the slow
    # server's capacity (a step keeps up at 90% of what it was offered, and its rate is
    # read over the window its answers came in, so up to a quarter above).
    assert 0 < knee.knee_tps < first.offered_rps, knee
    assert knee.knee_tps <= 1.25 / SLOW_S, knee
