"""Directories in the model cache, written whole or not at all.

Fetched and converted model files (S3 downloads, a GGUF's safetensors copy, OpenVINO IR)
are built in a directory of the process's own beside their target, marked complete, and
renamed into place. Processes that share a cache (several workers, or stacks with
different data dirs pointed at one `cache_dir`) may build the same target at once: the
first rename wins, the others discard their copy, and a complete target is never
removed under a process reading it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["COMPLETE", "is_complete", "partial_dir", "publish"]

COMPLETE = ".complete"


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
