"""Bulk embedding, one run, one machine: `shoal embed` on a file of short texts against
the model in process, and the bytes each wire format spends per vector.

    .venv/bin/python perf/bulk_embed.py [--texts 100000] [--probe 20000]

(a) sentence-transformers `encode(batch_size=64)` in this process on `--probe` of the
texts, before and after (b): the limit, as texts/s (its mean, so drift during the run
cancels); (b) `shoal embed texts.txt --output out.npy` as a subprocess against real
Shoal processes (nats-server, one worker, the gateway) on the same cores, timed from
start to exit (reading, checking, writing the .npy included). Wire bytes: the response
body per vector for one request of 256 texts on the native msgpack route, on
`/v1/embeddings` with `encoding_format` float and base64.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import msgspec  # noqa: E402
import numpy as np  # noqa: E402

from perf.embed_throughput import load_model, machine, short_texts  # noqa: E402
from shoal.queue.embedded import EmbeddedNats  # noqa: E402
from tests.helpers import MODEL, start_gateway, start_worker, wait_ready  # noqa: E402


def limit_rate(model, texts: list[str]) -> float:
    started = time.perf_counter()
    model.encode(texts, batch_size=64)
    return len(texts) / (time.perf_counter() - started)


def peak_memory(process: subprocess.Popen) -> dict[str, float]:
    """Peak MiB of the process while it runs, sampled from /proc: anonymous memory (what
    grows if something accumulates) and file pages (the .npy's memory map, reclaimable)."""
    peak = {"RssAnon": 0.0, "RssFile": 0.0}
    while process.poll() is None:
        try:
            for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in peak:
                    peak[key] = max(peak[key], int(value.split()[0]) / 1024)
        except OSError:
            pass
        time.sleep(0.2)
    return {k: round(v, 1) for k, v in peak.items()}


def wire_bytes(base: str, texts: list[str]) -> dict[str, float]:
    native = httpx.post(
        f"{base}/native/v1/embed",
        content=msgspec.msgpack.encode({"model": MODEL, "inputs": texts}),
        headers={"content-type": "application/msgpack"},
        timeout=120,
    )
    native.raise_for_status()
    sizes = {"native msgpack (float32)": len(native.content)}
    for fmt in ("float", "base64"):
        response = httpx.post(
            f"{base}/v1/embeddings",
            json={"model": MODEL, "input": texts, "encoding_format": fmt},
            timeout=120,
        )
        response.raise_for_status()
        sizes[f"OpenAI JSON, encoding_format={fmt}"] = len(response.content)
    return {name: round(size / len(texts), 1) for name, size in sizes.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=100_000)
    parser.add_argument("--probe", type=int, default=20_000)
    parser.add_argument("--out", default=str(ROOT / "perf" / "results"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    texts = short_texts(args.texts)
    model = load_model()
    model.encode(texts[:64], batch_size=64)
    before = limit_rate(model, texts[: args.probe])
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        source = tmp_path / "texts.txt"
        source.write_text("".join(t + "\n" for t in texts))
        nats = EmbeddedNats(tmp_path / "nats").start()
        worker = start_worker(nats.url, tmp_path)
        gateway, base = start_gateway(nats.url, tmp_path)
        try:
            wait_ready(base, worker)
            wires = wire_bytes(base, texts[:256])
            out = tmp_path / "out.npy"
            command = [sys.executable, "-m", "shoal", "embed", str(source), "--quiet"]
            command += ["--url", base, "--model", MODEL, "--output", str(out)]
            started = time.perf_counter()
            process = subprocess.Popen(command)
            peak = peak_memory(process)
            shoal_s = time.perf_counter() - started
            if process.returncode != 0:
                raise RuntimeError(f"shoal embed exited {process.returncode}")
            rows = np.load(out, mmap_mode="r").shape[0]
        finally:
            gateway.stop()
            worker.stop()
            nats.stop()
    after = limit_rate(model, texts[: args.probe])
    assert rows == len(texts), rows
    limit = (before + after) / 2
    shoal_rate = len(texts) / shoal_s
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "workload": {"texts": len(texts), "kind": "short (8-24 words)", "probe": args.probe},
        "machine": machine(),
        "limit_texts_per_s": {"before": round(before, 1), "after": round(after, 1)},
        "shoal_embed": {
            "seconds": round(shoal_s, 1),
            "texts_per_s": round(shoal_rate, 1),
            "peak_mib": peak,
        },
        "ratio_to_limit": round(shoal_rate / limit, 3),
        "wire_bytes_per_vector": wires,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out_dir / f"bulk_embed-{stamp}.json").write_text(json.dumps(report, indent=2) + "\n")
    md = [
        f"# Bulk embedding, {report['when']}",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {report['machine']}",
        "",
        "| target | texts/s | ratio to the limit |",
        "|---|---|---|",
        f"| in-process `encode(batch_size=64)`, before / after "
        f"| {before:.1f} / {after:.1f} | 1.0 |",
        f"| `shoal embed` ({len(texts)} texts, .npy) "
        f"| {shoal_rate:.1f} | {report['ratio_to_limit']} |",
        "",
        f"`shoal embed` peak memory: {peak['RssAnon']:.0f} MiB anonymous, "
        f"{peak['RssFile']:.0f} MiB file pages (the .npy's memory map and libraries)",
        "",
        "| wire format (384 dims) | response bytes per vector |",
        "|---|---|",
        *(f"| {name} | {size} |" for name, size in wires.items()),
        "",
    ]
    text = "\n".join(md)
    (out_dir / f"bulk_embed-{stamp}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
