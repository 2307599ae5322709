"""Directories in the model cache, written whole or not at all.

Fetched and converted model files (S3 downloads, a GGUF's safetensors copy, OpenVINO IR)
are built in a directory of the process's own beside their target, marked complete, and
renamed into place. Processes that share a cache (several workers, or stacks with
different data dirs pointed at one `cache_dir`) may build the same target at once: the
first rename wins, the others discard their copy, and a complete target is never
removed under a process reading it. Builders on one host take turns (`one_builder`), so
workers started together convert a model once, not once each on the same cores.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["COMPLETE", "is_complete", "one_builder", "partial_dir", "publish"]

COMPLETE = ".complete"
_POLL_S = 0.1


@contextlib.contextmanager
def one_builder(target: Path) -> Iterator[None]:
    """Held while this process builds `target` (`<cache>/<kind>/<key>`); a process that
    asks for the same target meanwhile waits, then finds it complete (check `is_complete`
    inside). The lock is the kernel's (`flock` on `<cache>/.locks/<kind>-<key>`, apart
    from the entries, so a listing of `<kind>` shows entries only): a builder that dies
    releases it. It is polled, not blocked on, so the waiting thread stays a plain
    sleeper; where no lock file can be made (a read-only cache) or the file system has no
    `flock`, each builds as before."""
    path = target.parent.parent / ".locks" / f"{target.parent.name}-{target.name}"
    with contextlib.ExitStack() as held:  # closing the file releases the lock
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = held.enter_context(open(path, "a"))
        except OSError:
            lock = None
        while lock is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(_POLL_S)
            except OSError:  # no flock here: a race, safe as before
                break
        yield


def is_complete(target: Path) -> bool:
    return (target / COMPLETE).exists()


def partial_dir(target: Path) -> Path:
    """An empty directory of this process's own to build `target` in."""
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    return partial


def publish(partial: Path, target: Path) -> Path:
    """Mark `partial` complete and move it to `target`, unless another process put a
    complete copy there first (then `partial` is discarded); `target`."""
    (partial / COMPLETE).touch()
    if not is_complete(target):
        shutil.rmtree(target, ignore_errors=True)  # an incomplete leftover, never a copy in use
        try:
            partial.rename(target)
            return target
        except OSError:  # another process renamed its copy in between
            pass
    shutil.rmtree(partial, ignore_errors=True)
    return target
