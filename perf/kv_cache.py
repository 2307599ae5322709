"""`python -m perf kv-cache`: the generation KV cache's precision on the shipped GGUF's
blocks (the native tier), quality and speed, so the default is chosen by measurement.

Quality: the weight guard's probe chats plus one long sequence of plain text, each answer
read back through the cache a token a step (weight_guard.read_through_cache: one pass
over a whole sequence attends to the fresh keys and values and never reads the cache's
precision back), against the float32 reference with an f32 cache; top-1 agreement and mean KL per
position. Speed:
OpenVINO GenAI in process (perf bakeoff's `openvino-native`), one stream and 32, with
prompts padded to about `--context` tokens, caches interleaved round by round.
Results: perf/results/kv-cache-<time>.{json,md}."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.bakeoff import built_in_irs, openvino_rounds  # noqa: E402
from perf.embed_throughput import machine  # noqa: E402
from perf.generation_throughput import prompts  # noqa: E402
from perf.reports import save_report  # noqa: E402

CACHES = ("f32", "f16", "u8")


def quality(threads: int) -> dict[str, dict]:
    import openvino as ov
    from transformers import AutoTokenizer

    from shoal.workers.generation.precision import NATIVE
    from shoal.workers.generation.weight_guard import (
        EXACT,
        PROBE_CHATS,
        position_scores,
        probe_sequences,
        read_through_cache,
        teacher_forced,
    )

    path, full, native = built_in_irs()
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = " ".join(answer for _, answer in PROBE_CHATS) * 3
    sequences = probe_sequences(tokenizer)
    sequences.append((tokenizer(text, add_special_tokens=False)["input_ids"][:600], 8))
    core = ov.Core()
    count = {"INFERENCE_NUM_THREADS": threads}
    reference = core.compile_model(str(full / "openvino_model.xml"), "CPU", EXACT | count)
    want = [teacher_forced(reference, ids)[start - 1 :] for ids, start in sequences]
    out = {}
    for cache in CACHES:
        properties = EXACT | NATIVE | count | {"KV_CACHE_PRECISION": cache}
        compiled = core.compile_model(str(native / "openvino_model.xml"), "CPU", properties)
        got = [read_through_cache(compiled, ids, start) for ids, start in sequences]
        scores = [position_scores(a, b) for a, b in zip(want, got, strict=True)]
        same = np.concatenate([agree for agree, _ in scores])
        kl = np.concatenate([divergence for _, divergence in scores])
        out[cache] = {"top1": float(same.mean()), "kl": float(kl.mean()), "positions": same.size}
        print(cache, out[cache], flush=True)
    return out


def speed(rounds: int, context: int, threads: int) -> dict[str, list[dict]]:
    from shoal.workers.generation.weight_guard import PROBE_CHATS

    words = " ".join(answer for _, answer in PROBE_CHATS).split()
    filler = " ".join(words[i % len(words)] for i in range(int(context * 0.75)))
    chats = [[{"role": "user", "content": f"{filler}\n\n{m[0]['content']}"}] for m in prompts(32)]
    out: dict[str, list[dict]] = {}
    for r in range(rounds):
        for cache in ("f32", "f16"):
            result = openvino_rounds([1, 32], chats, 64, threads, native=True, cache=cache)
            out.setdefault(cache, []).append(result)
            print(r, cache, {c: v["tokens_per_s"] for c, v in result.items()}, flush=True)
    return out


def _markdown(report: dict) -> str:
    lines = [
        "# KV cache precision (native tier, shipped GGUF)",
        "",
        f"`{report['command'].strip()}` ({_machine(report['machine'])})",
        "",
        "| cache | top-1 | mean KL (nats) | positions |",
        "|---|---|---|---|",
    ]
    for cache, q in report["quality"].items():
        lines.append(f"| {cache} | {q['top1']:.4f} | {q['kl']:.2e} | {q['positions']} |")
    lines += ["", "| cache | c=1 tokens/s (median) | c=32 tokens/s (median) | rounds |"]
    lines.append("|---|---|---|---|")
    for cache, rounds in report["speed"].items():
        med = {c: statistics.median(r[c]["tokens_per_s"] for r in rounds) for c in ("1", "32")}
        lines.append(f"| {cache} | {med['1']:.1f} | {med['32']:.1f} | {len(rounds)} |")
    return "\n".join(lines) + "\n"


def _machine(m: dict) -> str:
    return f"{m['cpu']}, {m['cores']} cores, {m['flags']}, torch {m['torch']}"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf kv-cache")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--context", type=int, default=600, help="prompt tokens, about")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=str(ROOT / "perf" / "results"))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    report = {
        "command": "python -m perf kv-cache " + " ".join(argv),
        "machine": machine(),
        "quality": quality(args.threads),
        "speed": speed(args.rounds, args.context, args.threads),
    }
    save_report(args.out, "kv-cache", report, _markdown(report))
