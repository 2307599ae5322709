"""The synthetic-data path: a Batches API job of chat lines against the engine's own
in-process throughput, and live chat latency under it against idle.

    .venv/bin/python -m perf chat-batch [--lines 500] [--max-tokens 64] [--live 12]

One run, one machine: (a) the engine in process (OpenVINO GenAI's pipeline on the
weights `--weights` names: `native`, the GGUF's own blocks, Shoal's default, or
`float32`) generates the same prompts closed loop at the model's slot count: its
tokens/s is the limit; (b) Shoal (nats-server, one generation worker, the gateway)
answers `--live` streamed chat requests one after another with nothing else running
(TTFT idle), then (c) runs a batch of `--lines` chat lines through the official openai
SDK, timed from create to completed (validation and finalizing included; tokens from
the output file's usage), while (d) the same live requests go on one after another
(TTFT under the batch). Results: perf/results/chat-batch-<time>.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.bakeoff import openvino_rounds  # noqa: E402
from perf.embed_throughput import machine  # noqa: E402
from perf.generation_throughput import (  # noqa: E402
    chat_stream_body,
    has_text,
    prompts,
    stream_chunk,
)
from perf.reports import save_report  # noqa: E402
from perf.stack import local_stack  # noqa: E402
from tests.helpers import GEN_MODEL  # noqa: E402


def _ttft(base: str, messages: list[dict], max_tokens: int) -> float:
    import httpx

    body = chat_stream_body(messages, max_tokens)
    started = time.perf_counter()
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            chunk = stream_chunk(line)
            if chunk is not None and has_text(chunk):
                return time.perf_counter() - started
    return float("nan")


def _live(base: str, chats: list, count: int, max_tokens: int, stop: threading.Event | None):
    """TTFTs of `count` streamed requests one after another (until `stop`, if given)."""
    out = []
    for i in range(count):
        if stop is not None and stop.is_set():
            break
        out.append(_ttft(base, chats[i % len(chats)], max_tokens))
        time.sleep(0.5)
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf chat-batch")
    parser.add_argument("--lines", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--live", type=int, default=12)
    parser.add_argument("--slots", type=int, default=32, help="the model profile's slots")
    parser.add_argument(
        "--weights", default="native", choices=["native", "float32"], help="the profile's tier"
    )
    parser.add_argument("--out", default=str(ROOT / "perf" / "results"))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from openai import OpenAI

    chats = prompts(args.lines)
    threads = os.cpu_count() or 1
    native = args.weights == "native"
    rounds = openvino_rounds([args.slots], chats, args.max_tokens, threads, native)
    inprocess = rounds[str(args.slots)]
    print(f"in process: {inprocess['tokens_per_s']} tokens/s", flush=True)
    live_chats = [[{"role": "user", "content": f"Name {n} colours."}] for n in range(2, 9)]
    profile = {"weights": args.weights, "max_batch_items": args.slots}
    with local_stack(profile, model=GEN_MODEL, kind="generate") as stack:
        idle = _live(stack.base, live_chats, args.live, 16, None)
        print(f"idle TTFT p50 {1000 * statistics.median(idle):.0f} ms", flush=True)
        lines = [
            {
                "custom_id": f"c-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": GEN_MODEL,
                    "messages": m,
                    "max_tokens": args.max_tokens,
                    "temperature": 0,
                },
            }
            for i, m in enumerate(chats)
        ]
        data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        oai = OpenAI(base_url=f"{stack.base}/v1", api_key="x", max_retries=0, timeout=120)
        uploaded = oai.files.create(file=("chat.jsonl", io.BytesIO(data)), purpose="batch")
        done = threading.Event()
        busy: list[float] = []
        watcher = threading.Thread(
            target=lambda: busy.extend(_live(stack.base, live_chats, 10_000, 16, done))
        )
        started = time.perf_counter()
        batch = oai.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        time.sleep(2.0)  # the batch is running before live requests join it
        watcher.start()
        deadline = time.monotonic() + 3600
        while batch.status not in ("completed", "failed", "cancelled", "expired"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch still {batch.status} after an hour")
            time.sleep(1.0)
            batch = oai.batches.retrieve(batch.id)
        seconds = time.perf_counter() - started
        done.set()
        watcher.join(180)
        output = oai.files.content(batch.output_file_id).text.splitlines()
        tokens = sum(
            json.loads(line)["response"]["body"]["usage"]["completion_tokens"] for line in output
        )
    rate = tokens / seconds
    report = {
        "command": "python -m perf chat-batch " + " ".join(argv),
        "machine": machine(),
        "args": vars(args),
        "inprocess_tokens_per_s": inprocess["tokens_per_s"],
        "batch": {"status": batch.status, "seconds": round(seconds, 1), "tokens": tokens},
        "batch_tokens_per_s": round(rate, 1),
        "batch_vs_inprocess": round(rate / inprocess["tokens_per_s"], 3),
        "ttft_idle_ms": [round(1000 * t) for t in idle],
        "ttft_busy_ms": [round(1000 * t) for t in busy],
        "ttft_p50_busy_vs_idle": round(statistics.median(busy) / statistics.median(idle), 2)
        if busy
        else None,
    }
    m = report["machine"]
    md = (
        f"`{report['command']}` on {m['cpu']} ({m['cores']} cores; {m.get('flags', '')}).\n\n"
        f"| | value |\n|---|---|\n"
        f"| engine in process ({args.slots} sequences) | {inprocess['tokens_per_s']} tokens/s |\n"
        f"| batch of {args.lines} chat lines ({tokens} tokens in {seconds:.0f} s) "
        f"| {rate:.1f} tokens/s ({report['batch_vs_inprocess']}x in process) |\n"
        f"| live TTFT p50 idle | {statistics.median(idle) * 1000:.0f} ms |\n"
        f"| live TTFT p50 under the batch | "
        f"{statistics.median(busy) * 1000 if busy else float('nan'):.0f} ms "
        f"({report['ttft_p50_busy_vs_idle']}x idle) |\n"
    )
    save_report(args.out, "chat-batch", report, md)
