"""Files and directories only this user may read: where Shoal keeps secrets on disk (the
settings `shoal serve` hands its processes, the embedded nats-server's password)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["private_dir", "write_private"]

log = logging.getLogger(__name__)


def private_dir(path: Path) -> None:
    """`path`, created if missing, readable by this user only. A directory another user
    owns is left as it is (the file modes still hold)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        log.info("%s: readable by others; narrowing it to this user (0700)", path)
        path.chmod(0o700)


def write_private(path: Path, data: bytes) -> Path:
    """Write `data` to `path` readable by this user only (0600), never briefly wider: the
    file is created with that mode, and an existing one is narrowed before it is written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)
    return path
