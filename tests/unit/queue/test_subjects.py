import pytest

from shoal.queue.subjects import Subjects, model_token, token_model


@pytest.mark.parametrize(
    "model_id",
    [
        "all-MiniLM-L6-v2",
        "BAAI/bge-small-en-v1.5",
        "org/name_with_underscores",
        "ünïcode/模型",
        "a.b*c>d e",
    ],
)
def test_model_token_is_one_safe_token_and_reversible(model_id: str) -> None:
    token = model_token(model_id)
    assert all(c.isascii() and (c.isalnum() or c in "-_") for c in token)
    assert token_model(token) == model_id


def test_consumer_filters_of_different_models_and_lanes_never_overlap() -> None:
    subjects = Subjects("shoal")
    a = subjects.work_filter("interactive", "a/b")
    b = subjects.work_filter("interactive", "a_2fb")  # the escaped spelling of "a/b"
    c = subjects.work_filter("batch", "a/b")
    assert len({a, b, c}) == 3
    assert subjects.work("interactive", "a/b", "embed").startswith(a[:-1])
    assert not subjects.work("interactive", "a/b", "embed").startswith(c[:-1])
