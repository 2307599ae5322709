"""The set of served models, looked up by id or alias."""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from .spec import ModelSpec, load_catalog

__all__ = ["BUILTIN_SPEC", "ModelRegistry", "UnknownModelError"]

BUILTIN_SPEC = Path(str(resources.files(__package__) / "models.toml"))


class UnknownModelError(LookupError):
    """No model by that name or alias."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class ModelRegistry:
    """Model specs by id; a later spec with the same id replaces an earlier one."""

    def __init__(self, specs: Iterable[ModelSpec]) -> None:
        self._by_id: dict[str, ModelSpec] = {}
        for spec in specs:
            self._by_id[spec.id] = spec
        self._by_name: dict[str, ModelSpec] = {}
        for spec in self._by_id.values():
            for name in (spec.id, *spec.aliases):
                self._by_name[name] = spec

    @classmethod
    def from_files(cls, *paths: str | Path) -> ModelRegistry:
        """The built-in spec, then each given file over it (empty paths are skipped)."""
        specs: list[ModelSpec] = []
        for path in (BUILTIN_SPEC, *paths):
            if path:
                specs.extend(load_catalog(path).models)
        return cls(specs)

    def resolve(self, name: str) -> ModelSpec:
        """The spec serving `name` (an id or an alias).

        Raises:
            UnknownModelError: no served model has that name.
        """
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownModelError(name) from None

    def __iter__(self):
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)
