"""The generation model's OpenVINO IR: exported once from the transformers directory, and
rebuilt with the checkpoint's own weights where they are narrower than float32.

`optimum-cli export openvino` (optimum-intel) pins a transformers older than Shoal's, so it
runs from its own environment (`generator.openvino_export_command`, by default the
`.venv-export` that `make setup` builds beside `.venv`). Its float32 IR is the reference
every tier is measured against (precision.py); `native_ir` puts a GGUF's quantized blocks
(gguf_weights.py) and 16-bit weights (float16_weights.py) back into it. Everything is
cached in the cache dir, written whole or not at all.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from ...config import GeneratorSettings
from ...lifecycle import die_with_parent
from ...model_registry.cache_dirs import is_complete, one_builder, partial_dir, publish
from ...model_registry.sources import gguf_file
from .float16_weights import mark_decompression, sixteen_bit_weights
from .gguf_weights import NativeWeights, native_weights

__all__ = ["export_command", "native_ir", "openvino_ir", "save_rebuilt"]

log = logging.getLogger(__name__)

_EXPORT_TIMEOUT = 3600.0
_NATIVE_VERSION = "4"  # bump when the graph built differs (2: K-quants, Q5_x; 3, 4: 16-bit)
_MODEL_FILES = ("openvino_model.xml", "openvino_model.bin")


def export_command(settings: GeneratorSettings) -> list[str]:
    """How to run `optimum-cli`: the settings' command, else one beside this Python,
    else the `.venv-export` beside this venv (what `make setup` builds).

    Raises:
        RuntimeError: none is installed.
    """
    if settings.openvino_export_command:
        return list(settings.openvino_export_command)
    here = Path(sys.executable).parent / "optimum-cli"
    beside = Path(sys.prefix).parent / ".venv-export" / "bin" / "optimum-cli"
    for candidate in (here, beside):
        if candidate.exists():
            return [str(candidate)]
    raise RuntimeError(
        "the OpenVINO runtime needs optimum-cli to export the model once: run `make setup` "
        "(it builds .venv-export), or set generator.openvino_export_command"
    )


def openvino_ir(
    source: str, cache_dir: Path, command: Sequence[str], weights: str = "fp32"
) -> Path:
    """The OpenVINO IR of the transformers model directory `source`: exported on first
    use (`weights`: optimum-cli's `--weight-format`, fp32 or int8), then read from the
    cache. Safe against a crash mid-export (a copy is used only once complete) and
    against two workers exporting at once."""
    src = Path(source)
    stamp = [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(src.iterdir())]
    if weights != "fp32":  # the float32 copy keeps the key it always had
        stamp.append(weights)
    key = hashlib.sha256(f"{src.resolve()}|{'|'.join(stamp)}".encode()).hexdigest()[:20]
    target = cache_dir / "openvino" / key
    with one_builder(target):
        if is_complete(target):
            return target
        partial = partial_dir(target)
        args = [
            *command, "export", "openvino", "--model", str(src),
            "--task", "text-generation-with-past", "--weight-format", weights, str(partial),
        ]  # fmt: skip
        log.info("exporting %s to OpenVINO IR (once): %s", src.name, " ".join(args))
        done = subprocess.run(  # a local directory: the export reads no hub
            args,
            capture_output=True,
            text=True,
            timeout=_EXPORT_TIMEOUT,
            preexec_fn=die_with_parent,  # the export dies with the worker
        )
        if done.returncode != 0 or not (partial / "openvino_model.xml").exists():
            shutil.rmtree(partial, ignore_errors=True)
            failed = (done.stderr or done.stdout)[-1500:]
            raise RuntimeError(f"the OpenVINO export failed: {failed}")
        return publish(partial, target)


def native_ir(source: str, full: Path, cache_dir: Path) -> tuple[Path, NativeWeights] | None:
    """The float32 IR `full` with the checkpoint's own weights put back where they are
    narrower than float32 (built on first use, then read from the cache), and what was
    replaced: a `gguf:` checkpoint's quantized blocks (gguf_weights.py), and every weight
    whose values are all 16-bit (float16_weights.py: a bf16 or f16 checkpoint, a GGUF's
    F16 tensors). None where nothing is narrower (a float32 checkpoint)."""
    import openvino as ov

    gguf = source.startswith("gguf:")
    stamp = f"{full.name}|{_NATIVE_VERSION}"
    if gguf:
        file = gguf_file(source)
        stat = file.stat()
        stamp += f"|{file}:{stat.st_size}:{stat.st_mtime_ns}"
    target = cache_dir / "openvino" / hashlib.sha256(stamp.encode()).hexdigest()[:20]
    replaced = target / "native_weights.json"
    with one_builder(target):
        if is_complete(target):
            done = msgspec.json.decode(replaced.read_bytes(), type=NativeWeights)
            return (target, done) if done.replaced else None
        model = ov.Core().read_model(str(full / "openvino_model.xml"))
        done = native_weights(model, file) if gguf else NativeWeights()
        for kind, count in sixteen_bit_weights(model).items():
            done.replaced[kind] = done.replaced.get(kind, 0) + count
        partial = partial_dir(target)
        partial.mkdir()
        (partial / replaced.name).write_bytes(msgspec.json.encode(done))
        if not done.replaced:  # remembered, so the next load does not read the graph again
            publish(partial, target)
            return None
        log.info("%s: the checkpoint's own weights (%s), once", source, done)
        save_rebuilt(model, full, partial)
        mark_decompression(partial / "openvino_model.xml")
        return publish(partial, target), done


def save_rebuilt(model, full: Path, partial: Path) -> None:
    """Save `model`, rebuilt from the float32 IR `full`, into `partial` with the files the
    export put beside `full`'s graph (tokenizer, config, chat template); not its guard's
    cached agreement, which was `full`'s own."""
    import openvino as ov

    for item in full.iterdir():
        if item.is_file() and item.name not in _MODEL_FILES and item.name != "agreement.json":
            shutil.copy2(item, partial / item.name)
    ov.save_model(model, str(partial / "openvino_model.xml"), compress_to_fp16=False)
