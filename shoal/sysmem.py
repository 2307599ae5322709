"""How much memory this process may use: the machine's RAM, or less where a container's
cgroup limits it (a pod's `resources.limits.memory`), so defaults sized from it hold in
a container as on a laptop."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["memory_limit"]

_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)


def memory_limit() -> int:
    """Bytes of memory this process may use: physical RAM, or its cgroup's limit if lower."""
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) or a huge number (v1) mean no limit
            limit = min(limit, int(text))
    return limit
