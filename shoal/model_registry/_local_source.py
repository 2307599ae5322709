"""Local paths named by run-time registrations: confined to the model roots.

A registration through the admin API may name a local path. Checked unconfined, that
would tell any caller whether any path exists, and a worker would then read and walk
whatever it names. So a registered path must lie under one of `model_roots` once
symlinks are followed, and so must every symbolic link inside it (a link is how a tree
under a root reaches out of it). Anything else gets one message, whether or not it
exists. Spec files are the operator's own and are not confined.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ._errors import SourceError

__all__ = ["confined_path"]

_REFUSED = "local paths must lie under a model root (setting `model_roots`)"


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path.is_relative_to(root) for root in roots)


def _resolved(path: Path | str) -> Path | None:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):  # a symlink loop, an unreadable directory
        return None


def confined_path(source: str, roots: Sequence[Path]) -> Path:
    """`source` with symlinks followed, if it and every link inside it lie under `roots`.

    Raises:
        SourceError: it lies elsewhere (one message, existing or not), it does not exist
            under a root, or a link inside it leads out of the roots.
    """
    raw = Path(source)
    # `..` is refused before anything is resolved: resolving it would step through
    # directories outside the roots and so answer whether they exist.
    if not raw.is_absolute() or ".." in raw.parts:
        raise SourceError(_REFUSED)
    real_roots = [root for root in map(_resolved, roots) if root is not None]
    path = _resolved(raw)
    if path is None or not _inside(path, real_roots):
        raise SourceError(_REFUSED)
    if not path.exists():
        raise SourceError(f"path {source} does not exist")
    if path.is_dir():
        _check_links(path, real_roots)
    return path


def _check_links(top: Path, roots: Sequence[Path]) -> None:
    """Walk `top` (and the directories its links lead to, all under `roots`), refusing a
    link that leads outside the roots; each directory is read once, so link cycles end."""
    seen = {top}
    pending = [top]
    while pending:
        directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue  # unreadable here: the loader reports it with the model
        for entry in entries:
            if entry.is_symlink():
                target = _resolved(entry.path)
                if target is None or not _inside(target, roots):
                    link = Path(entry.path)
                    shown = link.relative_to(top) if link.is_relative_to(top) else link
                    raise SourceError(
                        f"{shown} is a symbolic link that leads outside the model roots"
                    )
            elif entry.is_dir(follow_symlinks=False):
                target = Path(entry.path)
            else:
                continue
            if target not in seen and target.is_dir():
                seen.add(target)
                pending.append(target)
