"""Where a model's weights come from: a packaged model, a local path or a hub id."""

from __future__ import annotations

import importlib
from pathlib import Path

from .spec import ModelSpec

__all__ = ["resolve_source"]


def resolve_source(spec: ModelSpec) -> str:
    """A local directory or a hub id that the loading libraries accept for `spec`.

    Raises:
        ValueError: the source names a package that is not installed or has no weights.
    """
    source = spec.source
    if source.startswith("package:"):
        module_name = source.removeprefix("package:")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(
                f"model {spec.id!r}: package {module_name!r} is not installed"
            ) from exc
        return str(module.get_model_path())
    if source.startswith("hf:"):
        return source.removeprefix("hf:")
    path = Path(source).expanduser()
    if not path.exists():
        raise ValueError(f"model {spec.id!r}: path {path} does not exist")
    return str(path)
