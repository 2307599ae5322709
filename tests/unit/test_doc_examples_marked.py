"""Every code block of the README and the docs pages is an example a test runs or says
why it is not (`tests/e2e/test_readme_examples.py` runs them)."""

from __future__ import annotations

import pytest

from tests.doc_examples import PAGES, blocks


@pytest.mark.parametrize("page", PAGES)
def test_every_block_runs_or_says_why_not(page: str) -> None:
    unmarked = [b.id for b in blocks(page) if b.kind == "unmarked"]
    assert not unmarked, (
        f"{unmarked}: a block that is not python or shell needs"
        " `<!-- example: skip (WHY) -->` on the line before it"
    )
    assert all(b.why for b in blocks(page) if b.kind in ("skip", "setup")), "say why"
    if page in ("README.md", "docs/quickstart.md", "docs/api.md"):  # pages of examples
        assert any(b.kind in ("python", "shell") for b in blocks(page))
