"""The fenced code blocks of a Markdown page, as examples a test runs against a stack.

Every block is run or says why not, in an HTML comment on the line before it:

- `<!-- example: skip (WHY) -->`: not run (it starts the server, is a file, a tree...);
- `<!-- example: setup (WHY) -->`: a Python block run first in each later Python block
  of the page (the shared client);
- `<!-- example: answer (WHY) -->`: a JSON block showing what the shell block before it
  answers: every key it shows must be in the real answer;
- no comment: a `python` block is run; a `bash`/`sh` block is run with `curl` failing on
  an HTTP error and `shoal` being this checkout's.

A block of another language without a comment is `unmarked`, which the unit test
refuses, so that no example is left out silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
"""The pages whose examples `tests/e2e/test_readme_examples.py` runs."""
_MARK = re.compile(r"^<!--\s*example:\s*(skip|setup|answer)\b\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^```(\S*)\s*$")
RUNNABLE = {"python": "python", "bash": "shell", "sh": "shell", "shell": "shell"}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    """The line of the opening fence (1-based)."""
    lang: str
    code: str
    kind: str
    """`python`, `shell`, `setup`, `answer`, `skip` or `unmarked`."""
    why: str = ""

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}-{self.lang or 'text'}"


def blocks(page: str) -> list[Block]:
    """The fenced blocks of `page` (a path relative to the repository root), in order."""
    lines = (ROOT / page).read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start = i
        end = start + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        lang = fence.group(1)
        code = "\n".join(lines[start + 1 : end]) + "\n"
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        mark = _MARK.match(previous)
        if mark:
            kind, why = mark.group(1), mark.group(2).strip("()")
        else:
            kind, why = RUNNABLE.get(lang, "unmarked"), ""
        if kind == "setup" and lang != "python":
            kind = "unmarked"  # only Python sets up
        if kind == "answer" and (lang != "json" or not found or found[-1].kind != "shell"):
            kind = "unmarked"  # an answer is the JSON of the shell block right before it
        found.append(Block(page, start + 1, lang, code, kind, why))
        i = end + 1
    return found
