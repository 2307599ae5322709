"""Packing embeddings lines: which lines share a request, and each line's own answer."""

from __future__ import annotations

import base64
import json

import msgspec
import numpy as np

from shoal.api.batches.packing import Pack, packed_line
from shoal.compat.embed import Vectors
from shoal.compat.openai import EmbeddingRequest


def line(index: int, **body):
    request = msgspec.convert({"model": "m", "input": "hi", **body}, EmbeddingRequest)
    return packed_line(index, f"c{index}", b"{}", request)


def test_lines_pack_only_with_the_same_options_and_within_the_size() -> None:
    pack = Pack(line(0, input=["a", "b"]), max_inputs=4)
    assert pack.offer(line(1, input="c", user="someone else"))  # `user` shapes nothing
    assert not pack.offer(line(2, dimensions=8))
    assert not pack.offer(line(3, encoding_format="base64"))
    assert not pack.offer(line(4, model="other"))
    assert not pack.offer(line(5, input=[1, 2, 3]))  # token ids never join texts
    assert not pack.offer(line(6, input=["d", "e"]))  # 5 inputs > 4
    assert pack.offer(line(7, input="d"))
    assert [x.index for x in pack.lines] == [0, 1, 7]
    assert pack.inputs == 4


def test_inputs_the_live_route_refuses_are_never_packed() -> None:
    assert line(0, input=[]) is None
    assert line(1, input=["ok", ""]) is None


def test_each_line_gets_its_own_rows_indices_and_usage() -> None:
    pack = Pack(line(0, input=["a", "b"], encoding_format="base64"), max_inputs=10)
    assert pack.offer(line(1, input="c", encoding_format="base64"))
    matrix = np.arange(12, dtype="<f4").reshape(3, 4)
    vectors = Vectors(matrix.tobytes(), 3, 4, "float32", 9, 0.0, 0.0, row_tokens=[2, 3, 4])
    first, second = (json.loads(body) for body in pack.answers(vectors, "m"))
    assert [d["index"] for d in first["data"]] == [0, 1]
    assert [d["index"] for d in second["data"]] == [0]
    assert first["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    assert second["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    row = np.frombuffer(base64.b64decode(second["data"][0]["embedding"]), dtype="<f4")
    assert row.tolist() == matrix[2].tolist()
