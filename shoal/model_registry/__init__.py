"""Model specs, tuned batching profiles and name resolution (no torch here)."""

from .registry import BUILTIN_SPEC, ModelRegistry, UnknownModelError
from .sources import resolve_source
from .spec import BatchProfile, ModelCatalog, ModelSpec, load_catalog

__all__ = [
    "BUILTIN_SPEC",
    "BatchProfile",
    "ModelCatalog",
    "ModelRegistry",
    "ModelSpec",
    "UnknownModelError",
    "load_catalog",
    "resolve_source",
]
