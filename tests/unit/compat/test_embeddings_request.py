import msgspec
import pytest

from shoal.compat.errors import InvalidRequestError
from shoal.compat.jobs import RESULT_BYTES_PER_ITEM, split_points
from shoal.compat.openai import EmbeddingRequest

decode = msgspec.json.Decoder(EmbeddingRequest).decode


@pytest.mark.parametrize(
    ("body", "texts", "ids"),
    [
        (b'{"model": "m", "input": "hi"}', ["hi"], []),
        (b'{"model": "m", "input": ["a", "b"]}', ["a", "b"], []),
        (b'{"model": "m", "input": [1, 2, 3]}', [], [[1, 2, 3]]),
        (b'{"model": "m", "input": [[1, 2], [3]]}', [], [[1, 2], [3]]),
    ],
)
def test_every_openai_input_shape(body: bytes, texts: list, ids: list) -> None:
    assert decode(body).inputs() == (texts, ids)


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "input": []}',
        b'{"model": "m", "input": ""}',
        b'{"model": "m", "input": ["a", ""]}',
        b'{"model": "m", "input": ["a", 1]}',
        b'{"model": "m", "input": [[1], []]}',
        b'{"model": "m", "input": [[1], 2]}',
    ],
)
def test_bad_inputs_are_invalid_request_errors_naming_input(body: bytes) -> None:
    with pytest.raises(InvalidRequestError) as info:
        decode(body).inputs()
    assert info.value.param == "input"
    assert info.value.status_code == 400


def test_split_points_respect_items_bytes_and_reply_size() -> None:
    assert split_points([1] * 10, 4, 1000, 4) == [(0, 4), (4, 8), (8, 10)]
    assert split_points([600, 600, 10], 10, 1000, 4) == [(0, 1), (1, 3)]
    assert split_points([5000], 10, 1000, 4) == [(0, 1)]  # oversized travels alone
    rows = RESULT_BYTES_PER_ITEM // (4096 * 4)
    ranges = split_points([1] * (rows * 2), 10_000, 10**9, 4096 * 4)
    assert all(stop - start <= rows for start, stop in ranges)
    assert split_points([], 4, 10, 4) == []
