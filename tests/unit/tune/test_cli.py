"""`shoal tune`'s arguments and the refusals it makes before starting anything."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from shoal.cli import main
from shoal.tune.cli import parse_budget


def test_budgets_read_like_durations() -> None:
    assert parse_budget("10m") == 600
    assert parse_budget("90s") == parse_budget("90") == 90
    assert parse_budget("1.5h") == 5400
    for bad in ("", "ten minutes", "10d", "-5m"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_budget(bad)


def test_an_unknown_model_or_one_without_embed_or_generate_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    spec = tmp_path / "models.toml"
    spec.write_text(
        '[[models]]\nid = "reranker"\ntasks = ["rerank"]\nruntime = "transformers"\n'
        'source = "/nowhere"\nmax_length = 128\n'
    )
    monkeypatch.setenv("SHOAL_MODELS_FILE", str(spec))
    monkeypatch.setenv("SHOAL_DATA_DIR", str(tmp_path))
    assert main(["tune", "no-such-model", "--budget", "5s"]) == 2
    assert "no-such-model" in capsys.readouterr().err
    assert main(["tune", "reranker", "--budget", "5s"]) == 2
    assert "neither embed nor generate" in capsys.readouterr().err


def test_write_needs_a_spec_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.delenv("SHOAL_MODELS_FILE", raising=False)
    monkeypatch.setenv("SHOAL_DATA_DIR", str(tmp_path))
    assert main(["tune", "all-MiniLM-L6-v2", "--write"]) == 2
    assert "--write needs" in capsys.readouterr().err
