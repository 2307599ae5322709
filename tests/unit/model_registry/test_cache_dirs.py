"""Cache directories written whole or not at all, by processes that may share a cache."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from shoal.config import load_settings
from shoal.model_registry.cache_dirs import is_complete, one_builder, partial_dir, publish


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


_HOLDER = """
import sys
from pathlib import Path
from shoal.model_registry.cache_dirs import one_builder, partial_dir, publish

target = Path(sys.argv[1])
with one_builder(target):
    print("held", flush=True)
    sys.stdin.readline()  # builds when told to
    partial = partial_dir(target)
    partial.mkdir()
    (partial / "weights").write_text("theirs")
    publish(partial, target)
"""


def _holder(target: Path) -> subprocess.Popen:
    """Another process that takes `target`'s builder lock and says so."""
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(target)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline().strip() == "held"
    return process


def _waiter(target: Path) -> tuple[threading.Thread, list[bool]]:
    """A builder in this process: what it found on entering (complete or not)."""
    found: list[bool] = []

    def build() -> None:
        with one_builder(target):
            found.append(is_complete(target))

    thread = threading.Thread(target=build, daemon=True)
    thread.start()
    return thread, found


def test_a_second_builder_waits_and_finds_the_first_ones_copy(tmp_path: Path) -> None:
    target = tmp_path / "openvino" / "key"
    holder = _holder(target)
    try:
        thread, found = _waiter(target)
        thread.join(1.0)  # without the lock it enters at once and finds nothing built
        assert thread.is_alive() and found == []
        holder.communicate("go\n", timeout=30)
        thread.join(30)
        assert found == [True] and (target / "weights").read_text() == "theirs"
        assert [p.name for p in target.parent.iterdir()] == ["key"]  # the lock lies apart
    finally:
        holder.kill()


def test_a_builder_that_dies_lets_the_next_one_build(tmp_path: Path) -> None:
    target = tmp_path / "gguf" / "key"
    holder = _holder(target)
    holder.kill()  # mid-build: the kernel drops its lock with the process
    holder.wait(30)
    thread, found = _waiter(target)
    thread.join(30)
    assert found == [False]  # its turn, nothing built


def test_a_builder_that_cannot_make_the_lock_file_builds_as_before(tmp_path: Path) -> None:
    # A read-only cache, simulated: no mode bit stops root, who may run these tests, so
    # the lock file's name is taken by a directory instead.
    (tmp_path / ".locks" / "gguf-key").mkdir(parents=True)
    entered = []
    with one_builder(tmp_path / "gguf" / "key"):
        entered.append(True)
    assert entered == [True]
