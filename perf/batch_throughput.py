"""Batch jobs, one run, one machine: batch embeddings throughput against the model's
in-process limit, and live latency with a batch running against idle.

    .venv/bin/python perf/batch_throughput.py [--texts 6000] [--per-line 1,32] [--rounds 3]

Throughput, each round: (a) sentence-transformers `encode` in this process, batch 64: the
limit; (b) a Shoal batch of the same texts through the official openai SDK (upload,
create, poll, download), lines of `per-line` texts each, timed from create to completed
(validation and finalizing included). Latency, each round: live single-text embeddings
sent open loop at `--rate` per second with nothing else running, then again while a
batch of `--busy-texts` runs. Rounds interleave the targets because this VM drifts by
±15% between minutes; the report gives per-round ratios and their medians. Shoal runs as
real processes (nats-server, one worker, the gateway) sharing this machine's cores.
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

from perf.embed_throughput import load_model, machine, short_texts  # noqa: E402
from perf.stack import local_stack  # noqa: E402
from tests.helpers import MODEL  # noqa: E402


def batch_file(texts: list[str], per_line: int) -> bytes:
    lines = []
    for start in range(0, len(texts), per_line):
        chunk = texts[start : start + per_line]
        body = {"model": MODEL, "input": chunk[0] if per_line == 1 else chunk}
        lines.append(
            {"custom_id": f"r{start}", "method": "POST", "url": "/v1/embeddings", "body": body}
        )
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def run_batch(oai, data: bytes, timeout: float = 1800, started_event=None) -> tuple[float, int]:
    uploaded = oai.files.create(file=("perf.jsonl", io.BytesIO(data)), purpose="batch")
    started = time.perf_counter()
    batch = oai.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = oai.batches.retrieve(batch.id)
        if started_event is not None and (batch.request_counts.completed or 0) > 0:
            started_event.set()  # validated, and lines are being answered
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            break
        time.sleep(0.1)
    seconds = time.perf_counter() - started
    if batch.status != "completed":
        raise RuntimeError(f"batch ended {batch.status}: {batch}")
    lines = oai.files.content(batch.output_file_id).text.count("\n")
    return seconds, lines


def live_latencies(base: str, rate: float, count: int, texts: list[str]) -> dict[str, list[float]]:
    """Open loop: one request every 1/rate seconds whatever the answers do, each on its own
    thread. Milliseconds: the whole request as the client saw it, and the server's own
    split of it (`x-queue-time`: publish to pull; `x-inference-time`: pull to result)."""
    import httpx

    latencies: dict[str, list[float]] = {"total": [], "queue": [], "inference": []}
    lock = threading.Lock()

    def one(text: str) -> None:
        sent = time.perf_counter()
        response = httpx.post(
            f"{base}/v1/embeddings", json={"model": MODEL, "input": text}, timeout=60
        )
        response.raise_for_status()
        with lock:
            latencies["total"].append((time.perf_counter() - sent) * 1000)
            latencies["queue"].append(float(response.headers["x-queue-time"]))
            latencies["inference"].append(float(response.headers["x-inference-time"]))

    threads = []
    start = time.perf_counter()
    for i in range(count):
        at = start + i / rate
        time.sleep(max(0.0, at - time.perf_counter()))
        thread = threading.Thread(target=one, args=(texts[i % len(texts)],))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(120)
    return latencies


def percentiles(latencies: dict[str, list[float]]) -> dict[str, float]:
    def at(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

    total = latencies["total"]
    return {
        "p50": at(total, 0.5),
        "p90": at(total, 0.9),
        "p99": at(total, 0.99),
        "n": len(total),
        "queue_p50": at(latencies["queue"], 0.5),
        "inference_p50": at(latencies["inference"], 0.5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=6000)
    parser.add_argument("--per-line", default="1,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--live", type=int, default=100, help="live requests per phase")
    parser.add_argument("--busy-texts", type=int, default=8000)
    parser.add_argument("--out", default=str(ROOT / "perf" / "results"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from openai import OpenAI

    texts = short_texts(args.texts)
    per_lines = [int(x) for x in args.per_line.split(",") if x]
    model = load_model()
    model.encode(texts[:64], batch_size=64)
    throughput: list[dict] = []
    latency: list[dict] = []
    with local_stack() as base:
        oai = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=600)
        live_latencies(base, args.rate, 20, texts)  # warm up
        for round_ in range(args.rounds):
            started = time.perf_counter()
            model.encode(texts, batch_size=64)
            limit_s = time.perf_counter() - started
            row = {"round": round_, "limit_texts_per_s": round(len(texts) / limit_s, 1)}
            for per_line in per_lines:
                seconds, _ = run_batch(oai, batch_file(texts, per_line))
                row[f"shoal_{per_line}_per_line_texts_per_s"] = round(len(texts) / seconds, 1)
                row[f"ratio_{per_line}_per_line"] = round(limit_s / seconds, 3)
            throughput.append(row)
            print(row, flush=True)
        busy_texts = short_texts(args.busy_texts, seed=11)
        for round_ in range(args.rounds):
            idle = percentiles(live_latencies(base, args.rate, args.live, texts))
            running = threading.Event()
            runner = threading.Thread(
                target=run_batch,
                args=(oai, batch_file(busy_texts, 32)),
                kwargs={"started_event": running},
            )
            runner.start()
            running.wait(120)
            busy = percentiles(live_latencies(base, args.rate, args.live, texts))
            still_running = runner.is_alive()
            runner.join(1800)
            row = {
                "round": round_,
                "idle": idle,
                "batch_running": busy,
                "batch_ran_throughout": still_running,
                "p50_ratio": round(busy["p50"] / idle["p50"], 2),
            }
            latency.append(row)
            print(row, flush=True)
    medians = {
        f"ratio_{p}_per_line": statistics.median(r[f"ratio_{p}_per_line"] for r in throughput)
        for p in per_lines
    }
    medians["live_p50_ratio"] = statistics.median(r["p50_ratio"] for r in latency)
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "workload": {
            "texts": len(texts),
            "kind": "short (8-24 words)",
            "live_rate": args.rate,
            "busy_batch_texts": args.busy_texts,
        },
        "machine": machine(),
        "throughput_rounds": throughput,
        "latency_rounds": latency,
        "medians": medians,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"batch_throughput-{stamp}.json").write_text(json.dumps(report, indent=2) + "\n")
    md = [
        f"# Batch jobs, {report['when']}",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {report['machine']}",
        "",
        "| round | in-process limit texts/s | "
        + " | ".join(f"Shoal batch, {p}/line texts/s (ratio)" for p in per_lines)
        + " |",
        "|---" * (2 + len(per_lines)) + "|",
    ]
    for r in throughput:
        cells = [
            f"{r[f'shoal_{p}_per_line_texts_per_s']} ({r[f'ratio_{p}_per_line']})"
            for p in per_lines
        ]
        md.append(f"| {r['round']} | {r['limit_texts_per_s']} | " + " | ".join(cells) + " |")
    md += [
        "",
        "| round | phase | p50 ms | p90 ms | p99 ms | n | queue p50 ms | inference p50 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in latency:
        for phase in ("idle", "batch_running"):
            v = r[phase]
            md.append(
                f"| {r['round']} | {phase} | {v['p50']} | {v['p90']} | {v['p99']} | {v['n']} "
                f"| {v['queue_p50']} | {v['inference_p50']} |"
            )
    md += ["", "Medians over rounds: " + ", ".join(f"{k} {v}" for k, v in medians.items()), ""]
    if not all(r["batch_ran_throughout"] for r in latency):
        md.append("Note: in some round the batch ended before the live phase did.")
    text = "\n".join(md)
    (out / f"batch_throughput-{stamp}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
