"""The GGUF conversion's one parse: transformers asks gguf-py for a reader of the same file
three times and for the same tensor-name table once per module; within `_parsed_once` each
is made once, and gguf-py is as it was afterwards. (That the converted directory is the one
transformers writes without it, byte for byte, was checked on the shipped SmolLM2 file:
perf/results/README.md, issue #38.)"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from shoal.workers.generation.gguf import _parsed_once


@pytest.fixture
def file(tmp_path):
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_within_the_block_a_file_is_parsed_once_and_the_name_table_built_once(file) -> None:
    link = file.parent / "link.gguf"
    link.symlink_to(file)
    arch = gguf.MODEL_ARCH.LLAMA
    with _parsed_once():
        first = gguf.GGUFReader(str(file))
        assert gguf.GGUFReader(file) is first
        assert gguf.GGUFReader(str(link)) is first  # the same file by another name
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
        assert gguf.get_tensor_name_map(arch, 3) is not gguf.get_tensor_name_map(arch, 2)
    assert [t.name for t in first.tensors] == ["token_embd.weight"]


def test_after_the_block_gguf_py_is_as_it_was_even_when_the_block_failed(file) -> None:
    reader_type, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with pytest.raises(RuntimeError), _parsed_once():
        inside = gguf.GGUFReader(str(file))
        raise RuntimeError("the conversion failed")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader_type, name_map)
    assert gguf.GGUFReader(str(file)) is not inside
