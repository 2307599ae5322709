"""Where the engine's time goes, operator by operator, and how close it runs to the CPU.

    .venv/bin/python -m perf engine-ops [--rounds 10]

The packaged MiniLM as a worker loads it (the default profile: OpenVINO float32 on a CPU,
packed rows), its compiled graph compiled once more with OpenVINO's per-node counters on
(`PERF_COUNT`), on the same threads. Two batches: 8 passages (MiniLM truncates them at
256 tokens) and 64 short texts in random order, each packed as the worker packs it. For
each: wall time, the nodes' time by kernel and operator type, and the arithmetic rate
(GFLOP/s) of the matmuls (FullyConnected) and of attention (the fused
scaled-dot-product subgraph), counted from the model's shapes. Where OpenVINO runs
independent nodes at once (small batches), their times add up to more than the wall and
the per-operator rates read low; the whole forward's rate (by the wall) holds. A kernel's
name (`gemm_mlas_f32`, `brgconv_avx512_1x1_f32`, `jit_avx2_f32`, ...) says which
instruction set it runs on this CPU. Results: perf/results/engine-ops-<time>.md.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.embed_throughput import machine  # noqa: E402
from perf.texts import load  # noqa: E402
from perf.workloads import minilm_adapter, minilm_rows  # noqa: E402


def _flops(config, inputs: dict) -> tuple[float, float]:
    """(matmul, attention) floating-point operations of one forward over packed `inputs`:
    every row position through the layers' linear maps, and each row's full width of
    attention (scores and weighted values: what the kernel computes, padding included)."""
    rows, width = inputs["input_ids"].shape
    hidden, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    linear = 2 * rows * width * (4 * hidden * hidden + 2 * hidden * inner) * layers
    attention = 2 * rows * 2 * width * width * hidden * layers
    return linear, attention


def _profile(request, inputs: list, rounds: int) -> tuple[float, collections.Counter]:
    """Mean wall seconds of a forward, and mean seconds by (kernel, operator type)."""
    for _ in range(3):
        request.infer(inputs)
    nodes: collections.Counter = collections.Counter()
    started = time.perf_counter()
    for _ in range(rounds):
        request.infer(inputs)
        for node in request.profiling_info:
            nodes[(node.exec_type, node.node_type)] += node.real_time.total_seconds() / rounds
    return (time.perf_counter() - started) / rounds, nodes


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf engine-ops")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "perf" / "results"))
    args = parser.parse_args(argv)
    import openvino as ov
    import torch

    adapter = minilm_adapter()
    if adapter._engine is None or not adapter._engine_packs:
        sys.exit(f"the engine does not run packed rows here ({adapter.engine()}): nothing to read")
    engine, packed = adapter._engine, adapter._packed
    threads = torch.get_num_threads()
    config = {"INFERENCE_PRECISION_HINT": engine.precision, "PERF_COUNT": True}
    config |= {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}
    request = ov.Core().compile_model(engine._model, "CPU", config).create_infer_request()
    short = load("short")
    random.Random(1).shuffle(short)
    lines = []
    for name, texts in (("8 passages", load("passages")[:8]), ("64 short texts", short[:64])):
        inputs = adapter._packed_inputs(minilm_rows(adapter, texts), packed)
        wall, nodes = _profile(request, [inputs[n] for n in engine.names], args.rounds)
        linear, attention = _flops(adapter.model[0].auto_model.config, inputs)
        by_type = collections.Counter()
        for (_, op), seconds in nodes.items():
            by_type[op] += seconds
        total = sum(nodes.values())
        shape = "x".join(map(str, inputs["input_ids"].shape))
        lines += [
            f"## {name}: rows x width {shape}, {wall * 1e3:.1f} ms a forward "
            f"({len(texts) / wall:.1f} texts/s)",
            "",
            f"- the nodes' times add up to {total * 1e3:.1f} ms"
            + (
                " (more than the wall: some ran at once, each on fewer threads)"
                if total > wall * 1.1
                else ""
            ),
            f"- FullyConnected: {by_type['FullyConnected'] * 1e3:.1f} ms, "
            f"{linear / by_type['FullyConnected'] / 1e9:.0f} GFLOP/s",
            f"- attention (Subgraph): {by_type['Subgraph'] * 1e3:.1f} ms, "
            f"{attention / max(by_type['Subgraph'], 1e-9) / 1e9:.0f} GFLOP/s",
            f"- the whole forward: {(linear + attention) / wall / 1e9:.0f} GFLOP/s",
            "",
            "| ms | share | kernel | operator |",
            "|---|---|---|---|",
            *(
                f"| {seconds * 1e3:.2f} | {seconds / total:.1%} | `{kernel}` | {op} |"
                for (kernel, op), seconds in nodes.most_common(8)
            ),
            "",
        ]
    m = machine()
    command = "python -m perf engine-ops " + " ".join(argv)
    head = (
        f"# Engine operators: {adapter.engine()}, {threads} threads\n\n`{command.strip()}` on "
        f"{m['cpu']} ({m['cores']} cores; {m['flags']}), torch {m['torch']}, "
        f"OpenVINO {ov.__version__}; mean of {args.rounds} forwards.\n\n"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"engine-ops-{time.strftime('%Y%m%d-%H%M%S')}.md"
    path.write_text(head + "\n".join(lines))
    print(path.read_text())


if __name__ == "__main__":
    main(sys.argv[1:])
