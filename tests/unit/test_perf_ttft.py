"""How `python -m perf ttft` splits a client's TTFT by the request's trace."""

from __future__ import annotations

import pytest

from perf.ttft import PARTS, _split
from tests.otlp_receiver import ReceivedSpan

MS = 1_000_000  # ns


def _span(name: str, start_ms: float, end_ms: float, kind: int = 1) -> ReceivedSpan:
    return ReceivedSpan("svc", name, "t", name, "", int(start_ms * MS), int(end_ms * MS), kind)


def test_the_parts_are_the_gaps_between_the_marks_and_add_up_to_the_ttft() -> None:
    spans = [
        _span("POST /v1/chat/completions", 2.0, 90.0, kind=2),  # the gateway's (SERVER)
        _span("shoal.queue.wait", 3.5, 4.25),
        _span("shoal.generate.first_token", 4.25, 40.0),
        _span("shoal.generate.decode", 40.0, 80.0),
    ]
    parts = _split(0, 41 * MS, spans)
    assert parts == pytest.approx([2.0, 1.5, 0.75, 35.75, 1.0, 41.0])
    assert len(parts) == len(PARTS)
    assert sum(parts[:-1]) == pytest.approx(parts[-1])


def test_a_trace_without_the_worker_s_spans_or_a_first_chunk_is_left_out() -> None:
    server = _span("POST /v1/chat/completions", 2.0, 90.0, kind=2)
    assert _split(0, 41 * MS, [server, _span("shoal.queue.wait", 3.5, 4.25)]) is None
    full = [
        server,
        _span("shoal.queue.wait", 3.5, 4.25),
        _span("shoal.generate.first_token", 4.25, 40),
    ]
    assert _split(0, 0, full) is None
