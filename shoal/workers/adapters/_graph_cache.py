"""Encoder forwards converted to OpenVINO, kept in the model cache between processes.

Tracing a torch forward into an OpenVINO model takes about as long as the rest of a load
(perf/results/README.md), and every start of a worker (a restart after a crash, each stack
of the test suite) traced the same model again. The converted model is saved under the
cache dir, keyed by everything the trace depends on, and read back instead: the model's
weights and configuration, the module's structure, Shoal's graph code, the library
versions. What is read back is held to the same check at load as a fresh conversion (its
outputs on the probe texts against float32 torch), and a fresh conversion is read back
from its saved copy too, so a first start and a restart serve the same graph.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...model_registry.cache_dirs import is_complete, one_builder, partial_dir, publish

if TYPE_CHECKING:
    import openvino as ov

__all__ = ["cached_graph", "graph_key"]

log = logging.getLogger(__name__)

FORMAT = "1"
"""Changes when what is saved (or how it is converted) changes."""

_LIBRARIES = ("openvino", "torch", "transformers", "sentence-transformers", "peft")
_GRAPH = "graph.xml"
_WEIGHTS = "graph.bin"
_DIGEST = "sha256"


def graph_key(module: torch.nn.Module, names: Sequence[str]) -> str:
    """A digest of what converting `module` with inputs `names` depends on."""
    digest = hashlib.sha256()

    def add(text: str) -> None:
        digest.update(text.encode())
        digest.update(b"\0")

    add(FORMAT)
    add(",".join(names))
    add(f"{type(module).__module__}.{type(module).__qualname__}")
    add(repr(module))  # the structure, and the settings sentence-transformers prints
    for name in _LIBRARIES:
        add(f"{name}={_version(name)}")
    add(_code_digest())
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if hasattr(config, "to_dict"):  # where it was loaded from is no part of it
            settings = {k: v for k, v in config.to_dict().items() if k != "_name_or_path"}
            add(json.dumps(settings, sort_keys=True, default=str))
            add(str(getattr(config, "_attn_implementation", "")))
    for name, tensor in module.state_dict().items():
        add(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}")
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(flat.view(torch.uint8).numpy() if flat.numel() else b"")
    return digest.hexdigest()[:24]


def cached_graph(
    cache_dir: Path | None,
    module: torch.nn.Module,
    names: Sequence[str],
    convert: Callable[[], ov.Model],
) -> ov.Model:
    """`convert()`'s model, read from `cache_dir` where a process saved it before, else
    converted and saved there (without a cache dir: converted)."""
    import openvino as ov

    if cache_dir is None:
        return convert()
    target = cache_dir / "openvino-encoders" / graph_key(module, names)
    with one_builder(target):
        if is_complete(target):
            if _intact(target):
                log.info("OpenVINO graph read from %s", target)
                return ov.Core().read_model(target / _GRAPH)
            # Damaged since it was saved (a complete entry is written once): converted again.
            log.warning("OpenVINO graph in %s is damaged; converting it again", target)
            shutil.rmtree(target, ignore_errors=True)
        model = convert()
        partial = partial_dir(target)
        try:
            # Weights as converted: the default would store them as f16.
            ov.save_model(model, partial / _GRAPH, compress_to_fp16=False)
            (partial / _DIGEST).write_text(_digest(partial))
            publish(partial, target)
        except (OSError, RuntimeError) as exc:  # a read-only or full cache: a conversion, no more
            log.warning("OpenVINO graph not cached in %s: %s", target, exc)
            return model
        log.info("OpenVINO graph converted and cached in %s", target)
        return ov.Core().read_model(target / _GRAPH)


def _intact(entry: Path) -> bool:
    """Whether `entry`'s files are as they were saved."""
    try:
        return _digest(entry) == (entry / _DIGEST).read_text()
    except OSError:  # a file gone
        return False


def _digest(entry: Path) -> str:
    """The saved graph's files, to tell a damaged entry."""
    digest = hashlib.sha256()
    for name in (_GRAPH, _WEIGHTS):
        with open(entry / name, "rb") as file:
            digest.update(hashlib.file_digest(file, "sha256").digest())
    return digest.hexdigest()


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ""


def _code_digest() -> str:
    """Shoal's graph code: the forwards traced are written in this package."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()
