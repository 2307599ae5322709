"""The registry every gateway and worker shares: spec files plus run-time registrations.

Models and LoRA adapters registered through the admin API are stored in a JetStream
key-value bucket (`KeyValueStore`), so they survive restarts and every process sees the
same set: each one watches the bucket and applies changes as they come, and listeners
(workers) react to them without a restart. Spec-file models are fixed for the process's
life; registrations cannot replace or remove them.

Profile overrides (`set_profile`) replace the batching profile of any model, spec-file
ones included, in every process: `shoal tune` applies candidate profiles to running
workers this way and makes the winner live. Clearing one restores the spec's own profile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Protocol

import msgspec

from ..queue.subjects import model_token
from .registry import ModelRegistry, UnknownModelError
from .spec import AdapterSpec, BatchProfile, ModelSpec

__all__ = [
    "KeyValueStore",
    "LiveRegistry",
    "RegistryConflictError",
    "UnknownAdapterError",
]

log = logging.getLogger(__name__)

_MODEL = "model."
_ADAPTER = "adapter."
_PROFILE = "profile."
_encode = msgspec.msgpack.Encoder().encode
_decode_model = msgspec.msgpack.Decoder(ModelSpec).decode
_decode_adapter = msgspec.msgpack.Decoder(AdapterSpec).decode


class _ProfileOverride(msgspec.Struct, kw_only=True):
    """The value stored under `profile.<model token>`."""

    model: str
    profile: BatchProfile


_decode_override = msgspec.msgpack.Decoder(_ProfileOverride).decode


class KeyValueStore(Protocol):
    """Where run-time registrations live (a JetStream bucket)."""

    async def put(self, key: str, value: bytes) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def watch(self, on_change: Callable[[str, bytes | None], None]) -> None:
        """Deliver every current entry, return, then keep delivering changes."""
        ...


class UnknownAdapterError(LookupError):
    """No such adapter of that model."""

    def __init__(self, base: str, name: str) -> None:
        super().__init__(f"{base}:{name}")
        self.base = base
        self.name = name


class RegistryConflictError(ValueError):
    """The registration clashes with what is there (a taken name, a spec-file model)."""


def _adapter_key(base: str, name: str) -> str:
    return f"{_ADAPTER}{model_token(base)}.{model_token(name)}"


class LiveRegistry:
    """The spec files' models plus those registered at run time, followed live by every process."""

    def __init__(self, static: ModelRegistry, store: KeyValueStore | None = None) -> None:
        self._static = static
        self._store = store
        self._models: dict[str, ModelSpec] = {}
        self._adapters: dict[tuple[str, str], AdapterSpec] = {}
        self._profiles: dict[str, BatchProfile] = {}
        """Overrides by model id; kept for ids not (yet) served, so a registration that
        arrives after its override still gets it."""
        self._listeners: list[Callable[[], None]] = []
        self._rebuild()

    async def start(self) -> None:
        if self._store is not None:
            await self._store.watch(self._apply)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Called (with no arguments, on the event loop) after every change the watch
        applies; keep it short (set an event)."""
        self._listeners.append(listener)

    # Reading ---------------------------------------------------------------------------

    def resolve(self, name: str) -> ModelSpec:
        """Raises: UnknownModelError."""
        return self._names.resolve(name)

    def resolve_adapter(self, base: str, name: str) -> AdapterSpec:
        """Raises: UnknownAdapterError."""
        try:
            return self._adapters[(base, name)]
        except KeyError:
            raise UnknownAdapterError(base, name) from None

    def adapters(self, base: str | None = None) -> list[AdapterSpec]:
        return [a for (b, _), a in sorted(self._adapters.items()) if base in (None, b)]

    def is_builtin(self, model_id: str) -> bool:
        return any(spec.id == model_id for spec in self._static)

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    # Writing (the admin API) -------------------------------------------------------------

    def _store_or_fail(self) -> KeyValueStore:
        if self._store is None:
            raise RegistryConflictError("this registry has no store to register into")
        return self._store

    async def register_model(self, spec: ModelSpec) -> None:
        """Raises: RegistryConflictError (an id or alias already served)."""
        for name in (spec.id, *spec.aliases):
            try:
                self.resolve(name)
            except UnknownModelError:
                continue
            raise RegistryConflictError(f"a model named '{name}' is already registered")
        await self._store_or_fail().put(_MODEL + model_token(spec.id), _encode(spec))
        self._put_model(spec)

    async def remove_model(self, model_id: str) -> None:
        """Remove a registered model and its adapters.

        Raises: UnknownModelError, RegistryConflictError (a spec-file model).
        """
        if model_id not in self._models:
            if self.is_builtin(model_id):
                raise RegistryConflictError(
                    f"model '{model_id}' comes from a spec file and cannot be removed at run time"
                )
            raise UnknownModelError(model_id)
        store = self._store_or_fail()
        for adapter in self.adapters(model_id):
            await store.delete(_adapter_key(model_id, adapter.name))
            self._adapters.pop((model_id, adapter.name), None)
        await store.delete(_PROFILE + model_token(model_id))
        self._profiles.pop(model_id, None)
        await store.delete(_MODEL + model_token(model_id))
        self._drop_model(model_id)

    async def register_adapter(self, adapter: AdapterSpec) -> None:
        """Raises: UnknownModelError (no such base), RegistryConflictError (name taken)."""
        base = self.resolve(adapter.base)
        if base.id != adapter.base:
            adapter = msgspec.structs.replace(adapter, base=base.id)
        if (adapter.base, adapter.name) in self._adapters:
            raise RegistryConflictError(
                f"model '{adapter.base}' already has an adapter named '{adapter.name}'"
            )
        await self._store_or_fail().put(_adapter_key(adapter.base, adapter.name), _encode(adapter))
        self._adapters[(adapter.base, adapter.name)] = adapter

    async def remove_adapter(self, base: str, name: str) -> None:
        """Raises: UnknownAdapterError."""
        self.resolve_adapter(base, name)
        await self._store_or_fail().delete(_adapter_key(base, name))
        self._adapters.pop((base, name), None)

    async def set_profile(self, model_id: str, profile: BatchProfile) -> None:
        """Serve `model_id` (an id or alias) with `profile` instead of its spec's, in every
        process on the store, until `clear_profile`.

        Raises: UnknownModelError, RegistryConflictError (no store).
        """
        model_id = self.resolve(model_id).id
        override = _ProfileOverride(model=model_id, profile=profile)
        await self._store_or_fail().put(_PROFILE + model_token(model_id), _encode(override))
        self._put_profile(override)

    async def clear_profile(self, model_id: str) -> None:
        """Serve `model_id` with its spec's own profile again.

        Raises: UnknownModelError, RegistryConflictError (no store).
        """
        key = _PROFILE + model_token(self.resolve(model_id).id)
        await self._store_or_fail().delete(key)
        self._drop_profile(key)

    # Applying the watch --------------------------------------------------------------------

    def _put_model(self, spec: ModelSpec) -> None:
        if self.is_builtin(spec.id):
            log.warning("registration of %s ignored: a spec file defines it", spec.id)
            return
        self._models[spec.id] = spec
        self._rebuild()

    def _drop_model(self, model_id: str) -> None:
        if self._models.pop(model_id, None) is not None:
            self._rebuild()

    def _put_profile(self, override: _ProfileOverride) -> None:
        self._profiles[override.model] = override.profile
        self._rebuild()

    def _drop_profile(self, key: str) -> None:
        gone = [m for m in self._profiles if _PROFILE + model_token(m) == key]
        for model_id in gone:
            del self._profiles[model_id]
        if gone:
            self._rebuild()

    def _rebuild(self) -> None:
        specs = [*self._static, *self._models.values()]
        profiles = self._profiles
        self._names = ModelRegistry(
            msgspec.structs.replace(s, profile=profiles[s.id]) if s.id in profiles else s
            for s in specs
        )

    def _apply(self, key: str, value: bytes | None) -> None:
        if key.startswith(_MODEL):
            if value is None:
                model_id = next((m for m in self._models if _MODEL + model_token(m) == key), None)
                if model_id is not None:
                    self._drop_model(model_id)
            else:
                self._put_model(_decode_model(value))
        elif key.startswith(_ADAPTER):
            if value is None:
                gone = [k for k in self._adapters if _adapter_key(*k) == key]
                for k in gone:
                    del self._adapters[k]
            else:
                adapter = _decode_adapter(value)
                self._adapters[(adapter.base, adapter.name)] = adapter
        elif key.startswith(_PROFILE):
            if value is None:
                self._drop_profile(key)
            else:
                self._put_profile(_decode_override(value))
        for listener in self._listeners:
            listener()
