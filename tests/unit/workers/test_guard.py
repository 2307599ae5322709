"""The one measure of agreement with float32 torch: per-row cosine, a single column whole."""

from __future__ import annotations

import numpy as np

from shoal.workers.adapters._guard import row_cosines, worst_cosine


def test_rows_are_compared_one_by_one_and_token_matrices_flattened() -> None:
    a = np.array([[1.0, 0.0], [0.0, 2.0]])
    b = np.array([[2.0, 0.0], [1.0, 1.0]])
    np.testing.assert_allclose(row_cosines(a, b), [1.0, np.sqrt(0.5)])
    tokens = np.ones((2, 3, 4))
    flipped = tokens.copy()
    flipped[1, 0] = -1  # 4 of 12 values flip: (8 - 4) / 12
    np.testing.assert_allclose(row_cosines(tokens, flipped), [1.0, 1 / 3])


def test_one_score_per_row_is_compared_as_a_column() -> None:
    scores = np.array([[3.0], [-1.0], [0.5]])
    assert worst_cosine(scores, scores * 1.0001) > 0.9999999
    # Each row alone would keep its sign (cosine 1); the column sees the drift.
    assert worst_cosine(scores, np.array([[3.0], [1.0], [0.5]])) < 0.9


def test_a_zero_row_agrees_only_with_itself() -> None:
    zero = np.zeros((1, 3))
    assert worst_cosine(zero, zero) == 1.0
    assert worst_cosine(zero, np.array([[0.0, 1.0, 0.0]])) == 0.0
