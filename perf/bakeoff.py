"""The generation bake-off: every CPU engine on the same chat workload, side by side.

    .venv/bin/python -m perf bakeoff [--target shoal,shoal-torch,openvino,...] \\
        [--concurrency 1,8,32] [--prompts 64] [--max-tokens 64] [--rounds 1]

The workload is perf/generation_throughput.py's: 64 chat prompts ("Write two sentences
about <topic>.", seed 3) through SmolLM2-135M-Instruct's chat template, greedy,
`max_tokens` 64. Per target and concurrency c, a closed loop keeps c requests in flight
until every prompt is answered: output tokens/s (tokens / wall), TTFT p50/p90 and
per-request latency p50/p90. Targets run one after another in one run on one machine;
with `--rounds N` the list runs N times interleaved and each target reports its median
round, every round's tokens/s beside it.

Targets:
  shoal               `shoal serve`'s shape (nats-server, a generation worker, the
                      gateway), its default engine (OpenVINO GenAI, the GGUF's own Q4_1
                      blocks, float32 arithmetic), streamed over HTTP through the gateway
  shoal-float32       the same with `weights = "float32"`: every weight widened to
                      float32 (the default before), a lone greedy stream drafted by int8
  shoal-nodraft       `shoal-float32` without speculative decoding of a lone greedy
                      stream (`generator.openvino_draft_tokens = 0`)
  shoal-torch         the same with `engine = "torch"`: Shoal's transformers engine
  shoal-int8          the same with `weights = "int8"`: the float32 weights in Q8_0 blocks
                      (not exact; served once the load-time guard passes)
  shoal-int4          the same with `weights = "int4"`: Q4_1 blocks, the embedding Q8_0
  shoal-bf16          `shoal` on a 16-bit checkpoint: SmolLM2's weights rounded to bf16
                      and saved as one (no package ships a 16-bit SmolLM2; made once in
                      the cache dir), served by default as its own 16-bit weights
  shoal-bf16-float32  the same checkpoint with `weights = "float32"`: widened
  shoal-bf16-int8     the same checkpoint with `weights = "int8"` (Q8_0 blocks)
  shoal-bf16-int4     the same checkpoint with `weights = "int4"` (Q4_1 blocks)
  openvino            OpenVINO GenAI's ContinuousBatchingPipeline in process, float32
                      (the IR Shoal exports), stepped in one thread: the engine's limit
  openvino-native     the same on the IR with the GGUF's own blocks (Shoal's default)
  transformers-static transformers `generate` in process, static batches of c
  transformers-cb     transformers' own continuous batching (`generate_batch`, paged
                      cache), all prompts at once, at most c sequences decoded together
  shoal-gguf-<TYPE>   `shoal` on the GGUF llama.cpp's own llama-quantize makes of the
                      shipped file (F16, Q8_0, Q4_K_M, ...; perf/peers/llamacpp.py),
                      served as its own blocks
  llamacpp-np<N>      llama.cpp's own server, `-np N --cont-batching`, on the packaged
                      Q4_1 GGUF (perf/peers/llamacpp_server_venv.sh builds it), over HTTP
  llamacpp-np<N>-<TYPE>  the same on the GGUF of that type (as `shoal-gguf-<TYPE>`)

In-process figures have no server, no HTTP and no client on the same cores; served ones
do. Results: perf/results/bakeoff-<time>.{json,md}, with the machine described. Loopback
only; every loop is bounded by the prompts it has.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.embed_throughput import machine  # noqa: E402
from perf.generation_throughput import (  # noqa: E402
    chat_stream_body,
    has_text,
    prompts,
    stream_chunk,
)
from perf.peers.llamacpp import SHIPPED, gguf_of_type, llama_server  # noqa: E402
from perf.reports import save_report  # noqa: E402
from perf.stack import local_stack  # noqa: E402
from shoal.tune.knee import quantile  # noqa: E402
from tests.helpers import GEN_MODEL  # noqa: E402

TARGETS = "shoal,shoal-float32,openvino,openvino-native,llamacpp-np1,llamacpp-np32"


def _summary(wall: float, tokens: int, ttfts: list[float], latencies: list[float]) -> dict:
    return {
        "tokens_per_s": round(tokens / wall, 1) if wall else None,
        "output_tokens": tokens,
        "wall_s": round(wall, 2),
        "ttft_p50_ms": round(1000 * quantile(ttfts, 0.5), 1) if ttfts else None,
        "ttft_p90_ms": round(1000 * quantile(ttfts, 0.9), 1) if ttfts else None,
        "latency_p50_s": round(quantile(latencies, 0.5), 3) if latencies else None,
        "latency_p90_s": round(quantile(latencies, 0.9), 3) if latencies else None,
        "requests": len(latencies),
    }


# Served targets ------------------------------------------------------------------------


async def _http_round(url: str, model: str, chats: list, c: int, max_tokens: int) -> dict:
    """c streaming requests in flight (OpenAI chat, usage in the last chunk) until every
    prompt is answered."""
    import httpx

    queue = list(range(len(chats)))
    ttfts: list[float] = []
    latencies: list[float] = []
    tokens = 0
    errors: list[str] = []

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal tokens
        body = chat_stream_body(chats[i], max_tokens, model)
        started = time.perf_counter()
        first = None
        usage = None
        for _ in range(3):  # llama-server closes kept-alive connections now and then
            try:
                request = client.build_request("POST", f"{url}/v1/chat/completions", json=body)
                response = await client.send(request, stream=True)
                break
            except httpx.RemoteProtocolError:
                continue
        else:
            errors.append("no response after 3 attempts")
            return
        try:
            if response.status_code != 200:
                errors.append(f"HTTP {response.status_code}")
                return
            async for line in response.aiter_lines():
                chunk = stream_chunk(line)
                if chunk is None:
                    continue
                usage = chunk.get("usage") or usage
                if first is None and has_text(chunk):
                    first = time.perf_counter() - started
        finally:
            await response.aclose()
        latencies.append(time.perf_counter() - started)
        if first is not None:
            ttfts.append(first)
        if usage:
            tokens += usage["completion_tokens"]
        else:
            errors.append("no usage")

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            await one(client, queue.pop(0))

    limits = httpx.Limits(max_connections=c + 4, max_keepalive_connections=c + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await one(client, 0)  # warm-up, not counted
        ttfts.clear()
        latencies.clear()
        tokens = 0
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(c)))
        out = _summary(time.perf_counter() - started, tokens, ttfts, latencies)
    if errors:
        out["errors"] = [*errors[:5], f"{len(errors)} in all"]
    return out


@contextlib.contextmanager
def _shoal(profile: dict[str, str], env: dict[str, str] | None = None) -> Iterator[str]:
    with local_stack(profile, model=GEN_MODEL, kind="generate", env=env) as stack:
        yield stack.base


def bf16_checkpoint() -> Path:
    """SmolLM2 as a bf16 checkpoint: its float32 conversion rounded to bf16 and saved
    (once, in the cache dir beside that conversion). No package ships a 16-bit SmolLM2;
    this one stands for one."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    source = Path(_model_dir())
    checkpoint = source.parent / f"{source.name}-bf16"
    if not (checkpoint / "config.json").exists():
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
        partial = checkpoint.with_name(f"{checkpoint.name}.{os.getpid()}")
        model.save_pretrained(partial)
        for item in source.iterdir():  # the tokenizer and chat template
            if item.is_file() and not (partial / item.name).exists():
                shutil.copy2(item, partial / item.name)
        partial.rename(checkpoint)
    return checkpoint


def _source_spec(directory: Path, source: str) -> Path:
    """A user spec serving GEN_MODEL from `source`."""
    spec = directory / "model.toml"
    spec.write_text(
        f'[[models]]\nid = "{GEN_MODEL}"\ntasks = ["generate"]\nruntime = "transformers"\n'
        f'source = "{source}"\nmax_length = 2048\n'
    )
    return spec


@contextlib.contextmanager
def _shoal_from(source: str, profile: dict[str, str]) -> Iterator[str]:
    """`_shoal` on another checkpoint of the same model (`source`), with the built-in
    model's batching profile."""
    import msgspec

    from shoal.model_registry import ModelRegistry

    shipped = msgspec.to_builtins(ModelRegistry.from_files().resolve(GEN_MODEL).profile)
    with tempfile.TemporaryDirectory() as tmp:
        spec = _source_spec(Path(tmp), source)
        with local_stack(shipped | profile, model=GEN_MODEL, kind="generate", spec=spec) as stack:
            yield stack.base


# In-process targets -----------------------------------------------------------------------


def _model_dir() -> str:
    from shoal.config import load_settings
    from shoal.model_registry import ModelRegistry
    from shoal.workers.generation.gguf import materialize_gguf

    settings = load_settings(None)
    spec = ModelRegistry.from_files().resolve(GEN_MODEL)
    return materialize_gguf(spec.source, settings.cache_path)


def built_in_irs() -> tuple[str, Path, Path]:
    """The built-in chat model's transformers directory, its float32 IR and the IR with the
    GGUF's own blocks (Shoal's default), each built once into the cache dir."""
    from shoal.config import load_settings
    from shoal.model_registry import ModelRegistry
    from shoal.workers.generation.openvino_export import export_command, native_ir, openvino_ir

    settings = load_settings(None)
    path = _model_dir()
    full = openvino_ir(path, settings.cache_path, export_command(settings.generator))
    source = ModelRegistry.from_files().resolve(GEN_MODEL).source
    return path, full, native_ir(source, full, settings.cache_path)[0]


def openvino_rounds(
    concurrency: list[int],
    chats: list,
    max_tokens: int,
    threads: int,
    native: bool = False,
    cache: str = "f32",
) -> dict:
    """The engine in process, with the KV cache Shoal serves (f32) unless `cache` says
    otherwise (perf kv-cache)."""
    import numpy as np
    import openvino as ov
    import openvino_genai as og
    from transformers import AutoTokenizer

    from shoal.workers.generation.precision import NATIVE

    path, full, blocks = built_in_irs()
    ir, extra = (blocks, NATIVE) if native else (full, {})
    tokenizer = AutoTokenizer.from_pretrained(path)
    eos = tokenizer.eos_token_id
    scheduler = og.SchedulerConfig()
    scheduler.cache_size = 1
    scheduler.max_num_seqs = max(concurrency)
    scheduler.dynamic_split_fuse = True
    scheduler.enable_prefix_caching = True
    properties = {
        "INFERENCE_NUM_THREADS": threads,
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": cache,
    } | extra
    pipe = og.ContinuousBatchingPipeline(str(ir), scheduler, "CPU", properties)
    ids = [
        tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True)["input_ids"]
        for m in chats
    ]
    config = og.GenerationConfig()
    config.max_new_tokens = max_tokens

    def closed_loop(c: int, count: int) -> dict:
        pending = list(range(count))
        live: dict[int, tuple[Any, float]] = {}
        ttfts: list[float] = []
        latencies: list[float] = []
        seen: set[int] = set()
        tokens = 0
        started = time.perf_counter()
        while pending or live:
            while pending and len(live) < c:
                i = pending.pop(0)
                tensor = ov.Tensor(np.asarray([ids[i]], dtype=np.int64))
                live[i] = (pipe.add_request(i, tensor, config), time.perf_counter())
            pipe.step()
            now = time.perf_counter()
            for i, (handle, added) in list(live.items()):
                if handle.can_read():
                    for output in handle.read().values():
                        new = sum(1 for t in output.generated_ids if t != eos)
                        tokens += new
                        if new and i not in seen:
                            seen.add(i)
                            ttfts.append(now - added)
                if handle.get_status() != og.GenerationStatus.RUNNING and not handle.can_read():
                    latencies.append(now - added)
                    del live[i]
        return _summary(time.perf_counter() - started, tokens, ttfts, latencies)

    closed_loop(2, 2)  # warm-up: compile shapes, allocate the cache
    return {str(c): closed_loop(c, len(chats)) for c in concurrency}


def _transformers_rounds(concurrency: list[int], chats: list, max_tokens: int, cb: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    path = _model_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    eos = tokenizer.eos_token_id
    out: dict[str, dict] = {}
    for c in concurrency:
        started = time.perf_counter()
        tokens = 0
        latencies: list[float] = []
        if cb:
            ids = [
                tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True)[
                    "input_ids"
                ]
                for m in chats
            ]
            config = GenerationConfig(
                max_new_tokens=max_tokens, do_sample=False, max_batch_tokens=c * 256
            )
            with torch.inference_mode():
                results = model.generate_batch(ids, generation_config=config, progress_bar=False)
            for result in results.values():
                tokens += sum(1 for t in result.generated_tokens if t != eos)
        else:
            for start in range(0, len(chats), c):
                batch = chats[start : start + c]
                texts = [
                    tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
                    for m in batch
                ]
                inputs = tokenizer(
                    texts, return_tensors="pt", padding=True, add_special_tokens=False
                )
                begun = time.perf_counter()
                with torch.inference_mode():
                    generated = model.generate(
                        **inputs, max_new_tokens=max_tokens, do_sample=False,
                        pad_token_id=tokenizer.pad_token_id,
                    )  # fmt: skip
                latencies += [time.perf_counter() - begun] * len(batch)
                for row in generated[:, inputs["input_ids"].shape[1] :].tolist():
                    tokens += row.index(eos) if eos in row else len(row)
        out[str(c)] = _summary(time.perf_counter() - started, tokens, [], latencies)
    return out


# The run --------------------------------------------------------------------------------------


def _served(target: str, threads: int):
    if target == "shoal":
        return _shoal({})
    if target == "shoal-float32":
        return _shoal({"weights": "float32"})
    if target == "shoal-nodraft":
        return _shoal({"weights": "float32"}, {"SHOAL_GENERATOR__OPENVINO_DRAFT_TOKENS": "0"})
    if target == "shoal-torch":
        return _shoal({"engine": "torch"})
    if target in ("shoal-int8", "shoal-int4"):
        return _shoal({"weights": target.removeprefix("shoal-")})
    if target == "shoal-bf16":
        return _shoal_from(str(bf16_checkpoint()), {})
    if target in ("shoal-bf16-float32", "shoal-bf16-int8", "shoal-bf16-int4"):
        return _shoal_from(str(bf16_checkpoint()), {"weights": target.removeprefix("shoal-bf16-")})
    if target.startswith("shoal-gguf-"):
        return _shoal_from(f"gguf:{gguf_of_type(target.removeprefix('shoal-gguf-'))}", {})
    if target.startswith("llamacpp-np"):
        slots, _, kind = target.removeprefix("llamacpp-np").partition("-")
        return llama_server(int(slots), threads, kind or SHIPPED)
    return None


def run(args: argparse.Namespace) -> dict:
    """Each target's rounds; with `--rounds N` the target list runs N times interleaved
    (A B A B ...), so a drift of the machine falls on every target alike, and each target
    reports its median round (one stream's figure moves up to 20% between runs of the same
    code on the Xeon VM: perf/results/README.md)."""
    chats = prompts(args.prompts)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    results: dict[str, Any] = {}
    each: dict[str, list[dict]] = {}
    for turn in range(args.rounds):
        for target in args.target.split(","):
            if "failed" in results.get(target, {}):
                continue
            turns = f" round {turn + 1} of {args.rounds}" if args.rounds > 1 else ""
            print(f"{target}:{turns}", flush=True)
            try:
                rounds = _target_rounds(target, args, chats, concurrency)
            except (RuntimeError, ValueError, subprocess.CalledProcessError, TimeoutError) as exc:
                print(f"  failed: {str(exc)[-300:]}", flush=True)
                results[target] = {"failed": str(exc)[-300:]}
                continue
            for c, r in rounds.items():
                print(
                    f"  c={c}: {r['tokens_per_s']} tokens/s, TTFT p50 {r['ttft_p50_ms']} ms, "
                    f"latency p50 {r['latency_p50_s']} s",
                    flush=True,
                )
            each.setdefault(target, []).append(rounds)
            results[target] = median_round(each[target])
    return results


def _target_rounds(
    target: str, args: argparse.Namespace, chats: list, concurrency: list[int]
) -> dict[str, dict]:
    """One round of `target` at each concurrency."""
    served = _served(target, args.threads)
    if served is not None:
        with served as url:
            model = GEN_MODEL if target.startswith("shoal") else "m"
            return {
                str(c): asyncio.run(_http_round(url, model, chats, c, args.max_tokens))
                for c in concurrency
            }
    if target in ("openvino", "openvino-native"):
        native = target == "openvino-native"
        return openvino_rounds(concurrency, chats, args.max_tokens, args.threads, native)
    if target in ("transformers-static", "transformers-cb"):
        cb = target == "transformers-cb"
        return _transformers_rounds(concurrency, chats, args.max_tokens, cb)
    raise ValueError(f"unknown target {target!r}")


def median_round(rounds: list[dict[str, dict]]) -> dict[str, dict]:
    """Per concurrency, the round with the median tokens/s (the lower of the middle two
    for an even count), whole so its TTFT and latency belong to it, with every round's
    tokens/s beside it (`tokens_per_s_each`, in the order run) where there were several."""
    out = {}
    for c in rounds[0]:
        runs = [r[c] for r in rounds if c in r]
        ranked = sorted(runs, key=lambda r: r["tokens_per_s"])
        out[c] = dict(ranked[(len(ranked) - 1) // 2])
        if len(runs) > 1:
            out[c]["tokens_per_s_each"] = [r["tokens_per_s"] for r in runs]
    return out


def _markdown(report: dict) -> str:
    concurrency = report["args"]["concurrency"].split(",")
    head = " | ".join(f"c={c}" for c in concurrency)
    m = report["machine"]
    lines = [
        f"`{report['command']}` on {m['cpu']} ({m['cores']} cores; {m.get('flags', '')}), "
        f"torch {m['torch']}.",
        "",
        "Output tokens/s (TTFT p50 ms; request latency p50 s), closed loop, greedy, "
        f"{report['args']['prompts']} chat prompts, max_tokens {report['args']['max_tokens']}.",
        "",
        f"| target | {head} |",
        "|---|" + "---|" * len(concurrency),
    ]
    for target, rounds in report["results"].items():
        if "failed" in rounds:
            lines.append(f"| {target} | failed: {rounds['failed'][:80]} |")
            continue
        cells = []
        for c in concurrency:
            r = rounds.get(c, {})
            ttft = f"{r['ttft_p50_ms']:.0f} ms; " if r.get("ttft_p50_ms") else ""
            spread = r.get("tokens_per_s_each")
            each = f"; rounds {', '.join(map(str, spread))}" if spread else ""
            cells.append(f"{r.get('tokens_per_s')} ({ttft}{r.get('latency_p50_s')} s{each})")
        lines.append(f"| {target} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf bakeoff")
    parser.add_argument("--target", default=TARGETS)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=1, help="runs of the targets, interleaved")
    parser.add_argument("--out", default=str(ROOT / "perf" / "results"))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    report = {
        "command": "python -m perf bakeoff " + " ".join(argv),
        "machine": machine(),
        "args": vars(args),
        "results": run(args),
    }
    save_report(args.out, "bakeoff", report, _markdown(report))
