"""How close each generation weight tier answers to the float32 model of the same checkpoint.

    .venv/bin/python -m perf weight-quality [--tokens 20000] [--tiers native,native-dq32,...]
        [--gguf FILE.gguf]   # another GGUF of the same model (a Q4_K_M, say): its blocks
        [--against-shipped]  # with --gguf: against the shipped file's float32 model, not
                             # FILE's own (llama.cpp's reference, for a re-quantized file)
        [--bf16]             # SmolLM2 as a bf16 checkpoint: its 16-bit weights

The load-time guard (shoal/workers/generation/weight_guard.py) reads ~190 answer positions;
this reads >= `--tokens` positions the same way, teacher-forced, the way llama.cpp's
`llama-perplexity --kl-divergence` reports: every position of every sequence is scored
by the mean KL divergence of the tier's next-token distribution from float32's (nats)
and whether both pick the same next token (top-1). Half the positions are chat-templated
(a short question from perf/data/short.jsonl answered by a passage from
perf/data/passages.jsonl, through the model's chat template), half plain passages.

Tiers of the built-in SmolLM2-135M-Instruct (its Q4_1 GGUF), on OpenVINO:
  native        the GGUF's own blocks, float32 arithmetic, no dynamic quantization
                (Shoal's default)
  native-dq32   the same with OpenVINO's dynamic int8 quantization of activations,
                groups of 32 (OpenVINO's own default for compressed weights)
  native-bf16   the GGUF's blocks, bf16 arithmetic (where the CPU has bf16)
  float32-bf16  the float32 weights, bf16 arithmetic (`dtype = "bfloat16"`)
  int8          the float32 weights in Q8_0 blocks (`weights = "int8"`)
  int4          the float32 weights in Q4_1 blocks, the embedding Q8_0 (`weights = "int4"`)
  int8-channel  int8 weights per output channel from float32 (optimum's export: the int8
                tier before, and the draft of a lone float32 stream)

Results: perf/results/weight-quality-<time>.{json,md}, with the machine described.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.embed_throughput import machine  # noqa: E402
from perf.reports import save_report  # noqa: E402
from perf.texts import load  # noqa: E402
from tests.helpers import GEN_MODEL  # noqa: E402

TIERS = "native,native-dq32,native-bf16,float32-bf16,int8,int4,int8-channel"
_MAX_TOKENS = 512  # per sequence


def _sequences(tokenizer, tokens: int) -> list[list[int]]:
    """Token sequences, half chat-templated, half plain passages, >= `tokens` in all."""
    passages, questions = load("passages"), load("short")
    out: list[list[int]] = []
    counted = {"chat": 0, "plain": 0}
    for k, passage in enumerate(passages):
        kind = "chat" if k % 2 == 0 else "plain"
        if counted[kind] >= tokens / 2:
            continue
        if kind == "chat":
            chat = [
                {"role": "user", "content": questions[k % len(questions)]},
                {"role": "assistant", "content": passage},
            ]
            ids = tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True)
            ids = list(ids["input_ids"])
        else:
            ids = tokenizer(passage, add_special_tokens=False)["input_ids"]
        ids = ids[:_MAX_TOKENS]
        out.append(ids)
        counted[kind] += len(ids) - 1
        if min(counted.values()) >= tokens / 2:
            break
    return out


def _compiled(ir: Path, properties: dict):
    import openvino as ov

    return ov.Core().compile_model(str(ir / "openvino_model.xml"), "CPU", properties)


def run(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from shoal.config import load_settings
    from shoal.model_registry import ModelRegistry
    from shoal.workers.generation.gguf import materialize_gguf
    from shoal.workers.generation.openvino_export import export_command, native_ir, openvino_ir
    from shoal.workers.generation.precision import NATIVE
    from shoal.workers.generation.requantized import requantized_ir
    from shoal.workers.generation.weight_guard import EXACT, position_scores, teacher_forced

    settings = load_settings(None)
    spec = ModelRegistry.from_files().resolve(GEN_MODEL)
    if args.bf16:
        from perf.bakeoff import bf16_checkpoint

        source = path = str(bf16_checkpoint())
    else:
        source = f"gguf:{Path(args.gguf).resolve()}" if args.gguf else spec.source
        path = materialize_gguf(source, settings.cache_path)
    command = export_command(settings.generator)
    full = openvino_ir(path, settings.cache_path, command)
    built = native_ir(source, full, settings.cache_path)
    assert built is not None, f"{source} holds no weights narrower than float32"
    native = built[0]
    print(f"native weights of {source}: {built[1]}", flush=True)
    threads = {"INFERENCE_NUM_THREADS": args.threads}
    bf16 = {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "f32"}
    configs = {
        "native": (native, EXACT | NATIVE),
        "native-dq32": (native, EXACT | {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 32}),
        "native-bf16": (native, bf16 | NATIVE),
        "float32-bf16": (full, bf16),
        "int8-channel": (
            lambda: openvino_ir(path, settings.cache_path, command, "int8"),
            {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"},
        ),
        "int8": (lambda: requantized_ir(full, "int8", settings.cache_path), EXACT | NATIVE),
        "int4": (lambda: requantized_ir(full, "int4", settings.cache_path), EXACT | NATIVE),
    }
    tiers = args.tiers.split(",")
    exact = full
    if args.against_shipped:  # the file llama-quantize started from, as llama.cpp scores it
        shipped = materialize_gguf(spec.source, settings.cache_path)
        exact = openvino_ir(shipped, settings.cache_path, command)
    reference = _compiled(exact, EXACT | threads)
    compiled = {}
    for tier in tiers:
        ir, properties = configs[tier]
        compiled[tier] = _compiled(ir() if callable(ir) else ir, properties | threads)
    sequences = _sequences(AutoTokenizer.from_pretrained(path), args.tokens)
    same: dict[str, list[np.ndarray]] = {t: [] for t in tiers}
    kl: dict[str, list[np.ndarray]] = {t: [] for t in tiers}
    started = time.perf_counter()
    for k, ids in enumerate(sequences):
        want = teacher_forced(reference, ids)
        for tier in tiers:
            agree, divergence = position_scores(want, teacher_forced(compiled[tier], ids))
            same[tier].append(agree)
            kl[tier].append(divergence)
        if k % 10 == 9:
            print(f"  {k + 1}/{len(sequences)} sequences, {time.perf_counter() - started:.0f} s")
    results = {}
    for tier in tiers:
        s, d = np.concatenate(same[tier]), np.concatenate(kl[tier])
        results[tier] = {
            "positions": int(s.size),
            "top1": round(float(s.mean()), 5),
            "mean_kl": float(f"{d.mean():.3e}"),
            "kl_p99": float(f"{np.percentile(d, 99):.3e}"),
            "kl_max": float(f"{d.max():.3e}"),
        }
        print(f"{tier}: {results[tier]}", flush=True)
    return results


def _markdown(report: dict) -> str:
    m = report["machine"]
    against = "the shipped GGUF" if report["args"]["against_shipped"] else "the same checkpoint"
    lines = [
        f"`{report['command']}` on {m['cpu']} ({m['cores']} cores; {m.get('flags', '')}).",
        "",
        f"Teacher-forced against the float32 model of {against} (every position of "
        "half chat-templated, half plain sequences).",
        "",
        "| tier | positions | top-1 | mean KL (nats) | KL p99 | KL max |",
        "|---|---|---|---|---|---|",
    ]
    for tier, r in report["results"].items():
        lines.append(
            f"| {tier} | {r['positions']} | {r['top1']:.4f} | {r['mean_kl']:.2e} | "
            f"{r['kl_p99']:.2e} | {r['kl_max']:.2e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf weight-quality")
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--tiers", default=TIERS)
    parser.add_argument("--gguf", default=None, help="a GGUF file instead of the built-in one")
    parser.add_argument(
        "--against-shipped",
        action="store_true",
        help="with --gguf: score against the shipped GGUF's float32 model, not the file's own",
    )
    parser.add_argument(
        "--bf16", action="store_true", help="SmolLM2 as a bf16 checkpoint (perf bakeoff's)"
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=str(ROOT / "perf" / "results"))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    report = {
        "command": "python -m perf weight-quality " + " ".join(argv),
        "machine": machine(),
        "args": vars(args),
        "results": run(args),
    }
    save_report(args.out, "weight-quality", report, _markdown(report))
