"""Where a perf command's report goes: `<out>/<name>-<time>.json` (the figures) and `.md`
(the table), the Markdown printed too."""

from __future__ import annotations

import json
import time
from pathlib import Path

__all__ = ["save_report"]


def save_report(out: str | Path, name: str, report: dict, markdown: str) -> Path:
    """Write `report` and `markdown` beside each other in `out`; returns their stem."""
    stem = Path(out) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    stem.with_suffix(".md").write_text(markdown)
    print(markdown)
    return stem
