"""Every built-in model ships the batching profile `shoal tune` found for it, with the
machine it was found on named beside it."""

from __future__ import annotations

import tomllib

from shoal.model_registry import ModelRegistry
from shoal.model_registry.registry import BUILTIN_SPEC


def test_every_builtin_model_has_a_profile_from_a_named_reference_machine() -> None:
    text = BUILTIN_SPEC.read_text()
    raw = tomllib.loads(text)["models"]
    blocks = text.split("[[models]]")[1:]
    assert len(blocks) == len(raw) == len(ModelRegistry.from_files())
    for entry, block in zip(raw, blocks, strict=True):
        assert "profile" in entry, f"{entry['id']} ships no profile"
        assert entry["profile"], f"{entry['id']}'s profile is empty"
        assert "# Reference machine:" in block, f"{entry['id']}: which machine?"
        assert "shoal tune" in block, f"{entry['id']}: found how?"
