"""Model specs, tuned batching profiles and name resolution (no torch here)."""

from .live import KeyValueStore, LiveRegistry, RegistryConflictError, UnknownAdapterError
from .registry import BUILTIN_SPEC, ModelRegistry, UnknownModelError
from .sources import SourceError, SourceResolver, resolve_source
from .spec import AdapterSpec, BatchProfile, ModelCatalog, ModelSpec, load_catalog

__all__ = [
    "BUILTIN_SPEC",
    "AdapterSpec",
    "BatchProfile",
    "KeyValueStore",
    "LiveRegistry",
    "ModelCatalog",
    "ModelRegistry",
    "ModelSpec",
    "RegistryConflictError",
    "SourceError",
    "SourceResolver",
    "UnknownAdapterError",
    "UnknownModelError",
    "load_catalog",
    "resolve_source",
]
