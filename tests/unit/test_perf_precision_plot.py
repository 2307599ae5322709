"""`perf precision-plot`: each point's figures are read from the reports it names (a
weight-quality tier, a llama-perplexity summary, a bake-off target), never typed in, and the
table and PNG are written beside the points file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perf.precision_plot import joined, main

LLAMA_SUMMARY = """====== KL divergence statistics ======
Mean    KLD:   0.005496 ±   0.000060
Maximum KLD:   0.180748
====== Token probability statistics ======
Same top p: 90.215 ± 0.291 %
"""


def _reports(results: Path) -> list[dict]:
    (results / "wq.json").write_text(
        json.dumps({"results": {"int8": {"top1": 0.93, "mean_kl": 2.4e-3}}})
    )
    (results / "bake.json").write_text(
        json.dumps(
            {
                "results": {
                    "shoal-int8": {"1": {"tokens_per_s": 61.1}, "32": {"tokens_per_s": 406.4}},
                    "llamacpp-np1": {"1": {"tokens_per_s": 84.2}},
                }
            }
        )
    )
    (results / "kl.txt").write_text(LLAMA_SUMMARY)
    return [
        {"label": "int8", "engine": "Shoal", "checkpoint": "bf16",
         "quality": {"report": "wq.json", "tier": "int8"},
         "speed": {"report": "bake.json", "target": "shoal-int8"}},
        {"label": "Q4_1", "engine": "llama.cpp", "checkpoint": "gguf",
         "quality": {"llama_perplexity": "kl.txt"},
         "speed": {"report": "bake.json", "target": "llamacpp-np1"}},
        {"label": "float32", "engine": "Shoal", "checkpoint": "bf16",
         "quality": {"reference": True},
         "speed": {"report": "bake.json", "target": "shoal-int8"}},
    ]  # fmt: skip


def test_each_figure_comes_from_the_report_the_point_names(tmp_path: Path) -> None:
    rows = joined(_reports(tmp_path), tmp_path)
    assert [(r["top1"], r["mean_kl"], r["tokens_per_s"]) for r in rows] == [
        (0.93, 2.4e-3, {"1": 61.1, "32": 406.4}),
        (pytest.approx(0.90215), 0.005496, {"1": 84.2}),
        (1.0, 0.0, {"1": 61.1, "32": 406.4}),
    ]


def test_a_summary_without_kl_statistics_is_refused(tmp_path: Path) -> None:
    points = _reports(tmp_path)
    (tmp_path / "kl.txt").write_text("perplexity only\n")
    with pytest.raises(ValueError, match="no KL divergence statistics"):
        joined(points, tmp_path)


def test_the_table_and_the_plot_are_written_beside_the_points(tmp_path: Path) -> None:
    points = tmp_path / "points.json"
    points.write_text(json.dumps(_reports(tmp_path)))
    main([str(points)])
    [table] = tmp_path.glob("precision-*.md")
    assert "| llama.cpp | gguf | Q4_1 | 0.9022 | 5.5e-03 | 84.2 | - | kl.txt; bake.json |" in (
        table.read_text()
    )
    assert table.with_suffix(".png").stat().st_size > 10_000
