"""Cache directories written whole or not at all, by processes that may share a cache."""

from __future__ import annotations

from pathlib import Path

from shoal.config import load_settings
from shoal.model_registry.cache_dirs import is_complete, partial_dir, publish


def _build(target: Path, content: str) -> Path:
    partial = partial_dir(target)
    partial.mkdir()
    (partial / "weights").write_text(content)
    return partial


def test_a_built_directory_is_published_complete(tmp_path: Path) -> None:
    target = tmp_path / "gguf" / "key"
    partial = _build(target, "mine")
    assert not is_complete(target)
    assert publish(partial, target) == target
    assert is_complete(target) and (target / "weights").read_text() == "mine"
    assert not partial.exists()


def test_the_first_complete_copy_stays_and_later_ones_are_discarded(tmp_path: Path) -> None:
    """Another process finished first: its copy, maybe being read, is never replaced."""
    target = tmp_path / "key"
    publish(_build(target, "first"), target)
    reader = (target / "weights").open()
    late = _build(target, "second")
    assert publish(late, target) == target
    assert (target / "weights").read_text() == "first" and not late.exists()
    assert reader.read() == "first"
    reader.close()


def test_an_incomplete_leftover_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "key"
    target.mkdir()
    (target / "half").write_text("a crash left this")
    publish(_build(target, "whole"), target)
    assert is_complete(target) and not (target / "half").exists()


def test_the_cache_dir_defaults_under_the_data_dir_and_may_be_shared() -> None:
    assert load_settings(env={"SHOAL_DATA_DIR": "/d"}).cache_path == Path("/d/cache")
    shared = load_settings(env={"SHOAL_DATA_DIR": "/d", "SHOAL_CACHE_DIR": "/c"})
    assert shared.cache_path == Path("/c")
