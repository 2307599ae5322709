"""Batch jobs, one run, one machine: batch embeddings throughput against the model's
in-process limit, and live latency with a batch running against idle.

    .venv/bin/python perf/batch_throughput.py [--texts 20000] [--per-line 1,32]

(a) sentence-transformers `encode` in this process, batch 64: the limit; (b) a Shoal
batch through the official openai SDK (upload, create, poll, download), lines of
`per-line` texts each, timed from create to completed (validation and finalizing
included); (c) live single-text embeddings, sent open loop at `--rate` per second,
p50/p90/p99 with no batch running and again while a batch runs. Shoal runs as real
processes (nats-server, one worker, the gateway) sharing this machine's cores.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.embed_throughput import load_model, machine, short_texts  # noqa: E402
from shoal.queue.embedded import EmbeddedNats  # noqa: E402
from tests.helpers import MODEL, start_gateway, start_worker, wait_ready  # noqa: E402


def batch_file(texts: list[str], per_line: int) -> bytes:
    lines = []
    for start in range(0, len(texts), per_line):
        chunk = texts[start : start + per_line]
        body = {"model": MODEL, "input": chunk[0] if per_line == 1 else chunk}
        lines.append(
            {"custom_id": f"r{start}", "method": "POST", "url": "/v1/embeddings", "body": body}
        )
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def run_batch(oai, data: bytes, timeout: float = 1800) -> tuple[float, int]:
    uploaded = oai.files.create(file=("perf.jsonl", io.BytesIO(data)), purpose="batch")
    started = time.perf_counter()
    batch = oai.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = oai.batches.retrieve(batch.id)
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
    parser.add_argument("--texts", type=int, default=20000)
    parser.add_argument("--per-line", default="1,32")
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--live", type=int, default=150)
    parser.add_argument("--out", default=str(ROOT / "perf" / "results"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from openai import OpenAI

    texts = short_texts(args.texts)
    model = load_model()
    model.encode(texts[:64], batch_size=64)
    started = time.perf_counter()
    model.encode(texts, batch_size=64)
    limit_s = time.perf_counter() - started
    results: list[dict] = [
        {
            "target": "in-process sentence-transformers, batch 64 (limit)",
            "seconds": round(limit_s, 2),
            "texts_per_s": round(len(texts) / limit_s, 1),
            "ratio_to_limit": 1.0,
        }
    ]
    latency: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        nats = EmbeddedNats(tmp_path / "nats").start()
        worker = start_worker(nats.url, tmp_path)
        gateway, base = start_gateway(nats.url, tmp_path)
        try:
            wait_ready(base, worker)
            oai = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=600)
            live_latencies(base, args.rate, 20, texts)  # warm up
            for per_line in [int(x) for x in args.per_line.split(",") if x]:
                seconds, lines = run_batch(oai, batch_file(texts, per_line))
                results.append(
                    {
                        "target": f"shoal batch, {per_line} text(s) per line ({lines} lines)",
                        "seconds": round(seconds, 2),
                        "texts_per_s": round(len(texts) / seconds, 1),
                        "ratio_to_limit": round(limit_s / seconds, 3),
                    }
                )
            latency["idle"] = percentiles(live_latencies(base, args.rate, args.live, texts))
            data = batch_file(texts * 3, 32)
            runner = threading.Thread(target=run_batch, args=(oai, data))
            runner.start()
            time.sleep(3.0)  # the batch is validated and running
            latency["batch running"] = percentiles(
                live_latencies(base, args.rate, args.live, texts)
            )
            runner.join(1800)
        finally:
            gateway.stop()
            worker.stop()
            nats.stop()
    ratio = round(latency["batch running"]["p50"] / latency["idle"]["p50"], 2)
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "workload": {"texts": len(texts), "kind": "short (8-24 words)", "live_rate": args.rate},
        "machine": machine(),
        "throughput": results,
        "live_latency_ms": latency,
        "live_p50_ratio_batch_vs_idle": ratio,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"batch_throughput-{stamp}.json").write_text(json.dumps(report, indent=2) + "\n")
    rows = ["| target | seconds | texts/s | ratio to limit |", "|---|---|---|---|"]
    rows += [
        f"| {r['target']} | {r['seconds']} | {r['texts_per_s']} | {r['ratio_to_limit']} |"
        for r in results
    ]
    lat = [
        "| live single-text embeddings | p50 ms | p90 ms | p99 ms | n "
        "| queue p50 ms | inference p50 ms |"
    ]
    lat.append("|---|---|---|---|---|---|---|")
    for name, v in latency.items():
        lat.append(
            f"| {name} | {v['p50']} | {v['p90']} | {v['p99']} | {v['n']} "
            f"| {v['queue_p50']} | {v['inference_p50']} |"
        )
    md = "\n".join(
        [
            f"# Batch jobs, {report['when']}",
            "",
            f"Command: `{report['command']}`",
            "",
            f"Machine: {report['machine']}",
            "",
            *rows,
            "",
            *lat,
            "",
            f"Live p50 with a batch running / idle: {ratio}",
            "",
        ]
    )
    (out / f"batch_throughput-{stamp}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
