"""Every example in the README, the quickstart and the API page runs, in order, against
one real `shoal serve --demo`.

Python blocks run in a subprocess (after the page's setup block, the shared client), shell
blocks in bash with `curl` failing on an HTTP error; both with the stack's URL for
`127.0.0.1:8000`, in one working directory (a file an example writes, a later one reads).
A JSON block marked `<!-- example: answer -->` after a shell block shows its answer: each
key it shows must be in the real one.
A block marked `<!-- example: skip (WHY) -->` is not run; a block with no mark that is not
Python or shell fails `tests/unit/test_doc_examples_marked.py`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.doc_examples import PAGES, Block, blocks
from tests.helpers import GEN_MODEL, model_ready, start_serve, wait_ready, wait_until

pytestmark = pytest.mark.slow

EXAMPLES = [b for page in PAGES for b in blocks(page) if b.kind in ("python", "shell")]

ANSWERS: dict[str, Callable[[Any], Any]] = {
    # What each route's answer must hold (a KeyError or IndexError fails the example).
    "/ready": lambda a: a["ready_models"][0],
    "/v1/embeddings": lambda a: a["data"][0]["embedding"],
    "/v1/responses": lambda a: a["output"],
    "/v1/rerank": lambda a: a["results"][0]["relevance_score"],
    "/v1/score": lambda a: a["data"][0]["score"],
    "/v1/ner": lambda a: a["data"][0]["entities"][0]["label"],
    "/v1/classify": lambda a: a["data"][0]["labels"][0]["label"],
    "/v1/multivector": lambda a: a["data"][0]["embeddings"][0],
    "/v1/sparse": lambda a: a["data"][0]["indices"],
    "/tokenize": lambda a: a["tokens"][a["count"] - 1],
}
_SHELL = """set -euo pipefail
curl() { command curl -sS --fail-with-body "$@"; }
shoal() { "$PY" -m shoal "$@" --url "$BASE"; }
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`shoal serve --demo` with the chat model; the base URL."""
    data = tmp_path_factory.mktemp("readme") / "data"
    serve, base = start_serve(data, "--demo")
    try:
        wait_ready(base, serve, timeout=240)
        # The chat model's first start exports it to OpenVINO (the session's cache is
        # shared with the other stacks, so it is done once per test session).
        wait_until(lambda: model_ready(base, GEN_MODEL), 600, serve, GEN_MODEL)
        yield base
    finally:
        serve.stop()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("examples")


def _local(code: str, base: str) -> str:
    port = base.rsplit(":", 1)[1]
    return re.sub(r"(localhost|127\.0\.0\.1):8000\b", f"127.0.0.1:{port}", code)


def _setup(block: Block) -> str:
    return "".join(b.code for b in blocks(block.page) if b.kind == "setup" and b.line < block.line)


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize("block", EXAMPLES, ids=[b.id for b in EXAMPLES])
def test_the_example_runs(block: Block, stack: str, workdir: Path) -> None:
    import os

    if block.kind == "python":
        # As a user runs them: HF_HUB_OFFLINE (the suite's) would make huggingface_hub's
        # InferenceClient refuse even a local server's URL.
        user = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
        code = _local(_setup(block) + block.code, stack)
        out = _run([sys.executable, "-c", code], workdir, user)
        # `print(x)  # 2 384`: the comment is what it prints.
        for shown in re.findall(r"^\s*print\(.*\)\s+#\s*(.+)$", block.code, re.M):
            assert shown.strip() in out, f"printed {out!r}, the page says {shown!r}"
        return
    env = {**os.environ, "PY": sys.executable, "BASE": stack}
    out = _run(["bash", "-c", _SHELL + _local(block.code, stack)], workdir, env)
    routes = re.findall(r"127\.0\.0\.1:\d+(/[\w/]+)", _local(block.code, stack))
    if not routes:  # a `shoal` command: it said something
        assert out.strip()
        return
    answers = _json_values(out)
    assert len(answers) == len(routes), f"an answer per request: {out!r}"
    for route, answer in zip(routes, answers, strict=True):
        assert route in ANSWERS, f"add what {route}'s answer holds to ANSWERS"
        assert ANSWERS[route](answer) is not None, answer
    after = [b for b in blocks(block.page) if b.line > block.line][:1]
    if after and after[0].kind == "answer":  # the answer the page shows
        missing = set(re.findall(r'"(\w+)"\s*:', after[0].code)) - _keys(answers[-1])
        assert not missing, f"the page shows {sorted(missing)}, the answer has none: {out}"


def _keys(value: Any) -> set[str]:
    """Every key of every object in a JSON value."""
    if isinstance(value, dict):
        return set(value).union(*(_keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_keys(v) for v in value))
    return set()


def _json_values(text: str) -> list[Any]:
    """The JSON values printed one after another (a request's answer each)."""
    decoder, values, at, text = json.JSONDecoder(), [], 0, text.strip()
    while at < len(text):
        value, at = decoder.raw_decode(text, at)
        values.append(value)
        at += len(text[at:]) - len(text[at:].lstrip())
    return values
