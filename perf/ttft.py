"""Where one stream's first token goes: the client's TTFT split by the request's trace.

    .venv/bin/python -m perf ttft [--requests 40] [--max-tokens 8] [--tree DIR]

One stack (nats-server, one generation worker, the gateway) on loopback, its traces sent
to an OTLP receiver in this process. Streamed greedy chats, one after another, so nothing
queues. Each request's client-side send and first text chunk are put beside its trace's
spans: the gateway's server span, `shoal.queue.wait` (published to pulled) and
`shoal.generate.first_token` (pulled to the worker holding the first token: tokenizing,
the pipe to the engine's process, the prefill). What the engine itself takes is measured
by `perf bakeoff --target openvino-native` (in process). Every clock is this machine's.
Results: perf/results/ttft-<time>.{json,md}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.embed_throughput import machine  # noqa: E402
from perf.generation_throughput import chat_stream_body, has_text, prompts  # noqa: E402
from perf.reports import save_report  # noqa: E402
from perf.stack import local_stack  # noqa: E402
from tests.helpers import GEN_MODEL  # noqa: E402
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan  # noqa: E402

PARTS = (
    ("client to the gateway's span", "the client's send, uvicorn, the middleware before it"),
    ("gateway to published", "the route: parse, check, publish to JetStream"),
    ("queue wait", "published to pulled by the worker"),
    ("worker: pulled to first token", "tokenize, the engine's pipe, the prefill"),
    ("first token to the client", "the worker's publish, the gateway, the SSE chunk"),
    ("client TTFT", "send to the first text chunk"),
)
_WARM = 4  # requests not counted: the first compiles shapes and opens connections


def _stream(http, messages: list[dict], max_tokens: int) -> tuple[int, int]:
    """(sent, first text chunk) of one streamed greedy chat, Unix ns."""
    body = chat_stream_body(messages, max_tokens)
    sent = time.time_ns()
    first = 0
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not first and line.startswith("data: {") and has_text(json.loads(line[6:])):
                first = time.time_ns()
    return sent, first


def _split(sent: int, first: int, spans: list[ReceivedSpan]) -> list[float] | None:
    """The request's parts (ms, in `PARTS` order) from its trace, or None if incomplete."""
    named = {s.name: s for s in spans}
    [server] = [s for s in spans if s.kind == 2] or [None]  # SERVER: the gateway's
    queue, worker = named.get("shoal.queue.wait"), named.get("shoal.generate.first_token")
    if server is None or queue is None or worker is None or not first:
        return None
    marks = [sent, server.start_ns, queue.start_ns, queue.end_ns, worker.end_ns, first]
    parts = [(b - a) / 1e6 for a, b in itertools.pairwise(marks)]
    return [*parts, (first - sent) / 1e6]


def main(argv: list[str]) -> None:
    import httpx

    parser = argparse.ArgumentParser(prog="python -m perf ttft")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--tree", type=Path, help="run Shoal from another checkout (before/after)")
    parser.add_argument("--out", default=str(ROOT / "perf" / "results"))
    args = parser.parse_args(argv)
    receiver = OtlpReceiver()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    sent_first = []
    try:
        with local_stack(model=GEN_MODEL, kind="generate", env=env, tree=args.tree) as stack:
            with httpx.Client(base_url=stack.base, timeout=120) as http:
                for messages in prompts(args.requests + _WARM):
                    sent_first.append(_stream(http, messages, args.max_tokens))
                    time.sleep(0.05)
            time.sleep(2.0)  # the processes' span batches (200 ms) reach the receiver
        servers = [s for s in receiver.spans if s.kind == 2]
        rows = []
        for sent, first in sent_first[_WARM:]:
            server = min(servers, key=lambda s: abs(s.start_ns - sent))
            row = _split(sent, first, receiver.trace(server.trace_id))
            if row is not None:
                rows.append(row)
    finally:
        receiver.close()
    if not rows:
        raise SystemExit("no complete trace came back")
    p50 = {
        name: round(statistics.median(r[i] for r in rows), 2) for i, (name, _) in enumerate(PARTS)
    }
    report = {
        "command": " ".join(["python -m perf ttft", *argv]),
        "machine": machine(),
        "requests": len(rows),
        "p50_ms": p50,
    }
    m = report["machine"]
    lines = [
        f"`{report['command']}` on {m['cpu']} ({m['cores']} cores; {m.get('flags', '')}), "
        f"{len(rows)} streamed greedy chats one after another, p50 of each part:",
        "",
        "| part | what | ms |",
        "|---|---|---|",
        *(f"| {name} | {what} | {p50[name]} |" for name, what in PARTS),
    ]
    save_report(args.out, "ttft", report, "\n".join(lines) + "\n")
