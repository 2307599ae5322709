"""`shoal tune --write`: the winner goes into the user's spec file, which stays theirs
(comments, other models) and stays valid."""

from __future__ import annotations

from pathlib import Path

from shoal.model_registry import BatchProfile, ModelRegistry
from shoal.tune.report import write_profile

TUNED = BatchProfile(max_batch_tokens=16384, max_batch_items=128, max_wait_ms=1.0, threads=2)


def test_a_builtin_model_gets_an_entry_copied_from_its_spec(tmp_path: Path) -> None:
    spec_path = tmp_path / "models.toml"
    spec_path.write_text("# mine\nmodels = []\n")
    builtin = ModelRegistry.from_files().resolve("all-MiniLM-L6-v2")
    write_profile(spec_path, builtin, TUNED, "shoal tune 300 texts/s on a test box")
    written = ModelRegistry.from_files(spec_path).resolve("all-MiniLM-L6-v2")
    assert written.profile == TUNED
    assert written == builtin.__class__(**{**_fields(builtin), "profile": TUNED})
    text = spec_path.read_text()
    assert text.startswith("# mine") and "# shoal tune 300 texts/s on a test box" in text


def test_an_entry_already_there_keeps_everything_but_its_profile(tmp_path: Path) -> None:
    spec_path = tmp_path / "models.toml"
    spec_path.write_text(
        '[[models]]\nid = "other"\ntasks = ["embed"]\nsource = "/models/other"\n'
        "max_length = 128\ndims = 8  # small\n\n"
        '[[models]]\nid = "mine"\ntasks = ["embed"]\nsource = "/models/mine"\n'
        "max_length = 512\ndims = 768\n[models.profile]\nmax_batch_items = 8\n"
    )
    mine = ModelRegistry.from_files(spec_path).resolve("mine")
    write_profile(spec_path, mine, TUNED, "tuned")
    registry = ModelRegistry.from_files(spec_path)
    assert registry.resolve("mine").profile == TUNED
    assert registry.resolve("mine").max_length == 512
    assert registry.resolve("other").profile == BatchProfile()
    assert "dims = 8  # small" in spec_path.read_text()
    write_profile(spec_path, mine, BatchProfile(max_batch_items=4), "again")
    assert ModelRegistry.from_files(spec_path).resolve("mine").profile.max_batch_items == 4


def test_a_missing_file_is_made(tmp_path: Path) -> None:
    spec_path = tmp_path / "new.toml"
    builtin = ModelRegistry.from_files().resolve("all-MiniLM-L6-v2")
    write_profile(spec_path, builtin, TUNED, "tuned")
    assert ModelRegistry.from_files(spec_path).resolve("all-MiniLM-L6-v2").profile == TUNED


def _fields(spec) -> dict:
    return {f: getattr(spec, f) for f in spec.__struct_fields__}
