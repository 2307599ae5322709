"""The docs site builds with no warning and loads nothing from the network; the README
stays a README: at most 300 lines, its links resolve, and its layout section names the
modules allowed over the size limit."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.api.endpoints import ENDPOINTS
from tests.unit.test_module_sizes import OVER_SOFT_LIMIT

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_README_LINES = 300
MAX_LINE = 100

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
REMOTE_ASSET = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"(https?://[^\"]+)\"")


def test_the_docs_build_with_no_warning(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail("mkdocs is not installed: pip install -e '.[dev]' (mkdocs-material)")
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=240,
    )
    said = [line for line in result.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert result.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(
        said or result.stderr.splitlines()[-30:]
    )
    pages = list(site.rglob("*.html"))
    assert len(pages) > 10
    remote = {p.relative_to(site).as_posix(): REMOTE_ASSET.findall(p.read_text()) for p in pages}
    assert {page: urls for page, urls in remote.items() if urls} == {}, "assets off the network"
    reference = (site / "configuration" / "index.html").read_text()
    assert "SHOAL_GATEWAY__REQUEST_TIMEOUT" in reference  # the hook wrote the settings
    assert "usage: shoal serve" in (site / "cli" / "index.html").read_text()
    api = (site / "api" / "index.html").read_text()
    for endpoint in ENDPOINTS:  # the routes that run work, from the route table
        for path in endpoint.paths:
            assert f"<code>POST {path}</code>" in api, path


def test_the_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md: {len(lines)} lines; move detail to docs/"
    long = [n for n, line in enumerate(lines, 1) if len(line) > MAX_LINE and "|" not in line]
    assert long == [], f"README.md lines over {MAX_LINE} characters (tables aside): {long}"


def test_the_readme_links_resolve() -> None:
    broken = []
    for target in LINK.findall(README.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no such heading in {path}")
    assert broken == [], broken
    assert any(t.startswith("docs/") for t in LINK.findall(README.read_text()))


def test_the_readme_layout_names_the_modules_over_the_soft_limit() -> None:
    text = README.read_text()
    layout = text.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    missing = sorted(m for m in OVER_SOFT_LIMIT if f"shoal/{m}" not in layout)
    assert missing == [], f"name these in the README's layout section: {missing}"


def _anchors(page: Path) -> set[str]:
    """The ids MkDocs (Python-Markdown's toc) gives the page's headings."""
    from markdown.extensions.toc import slugify  # mkdocs' own dependency

    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", page.read_text(), flags=re.MULTILINE)
    return {slugify(re.sub(r"[`*]", "", h), "-") for h in headings}
