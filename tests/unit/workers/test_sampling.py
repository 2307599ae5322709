"""Next-token sampling at the edges of OpenAI's parameter ranges, and a failing row that
must not take its batch mates with it."""

from __future__ import annotations

import pytest
import torch

from shoal.workers.generation.sampling import RowParams, sample

VOCAB = 50


def row(temperature: float = 1.0, top_p: float = 1.0, seed: int = 7) -> RowParams:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return RowParams(temperature, top_p, 0.0, 0.0, generator, 0, False)


def logits(rows: int) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(rows, VOCAB) * 5


def draw(scores: torch.Tensor, rows: list[RowParams], allowed=None) -> tuple[list[int], dict]:
    tokens, _, _, failed = sample(scores, rows, torch.zeros(scores.shape), allowed)
    return tokens, failed


@pytest.mark.parametrize("temperature", [0.0, 1e-40, 1e-30, 1e-6])
def test_a_tiny_temperature_is_greedy(temperature: float) -> None:
    scores = logits(1)
    tokens, failed = draw(scores, [row(temperature=temperature)])
    assert not failed
    assert tokens == [int(scores[0].argmax())]


@pytest.mark.parametrize("top_p", [1e-46, 1e-45, 1e-30, 1e-3])
def test_a_tiny_top_p_keeps_the_likeliest_token(top_p: float) -> None:
    scores = logits(1)
    for seed in range(5):
        tokens, failed = draw(scores, [row(top_p=top_p, seed=seed)])
        assert not failed
        assert tokens == [int(scores[0].argmax())]


def test_a_small_temperature_above_the_greedy_bound_still_samples() -> None:
    scores = torch.zeros(1, VOCAB)  # all tokens equally likely
    seen = {draw(scores, [row(temperature=1e-4, seed=seed)])[0][0] for seed in range(20)}
    assert len(seen) > 1


def test_a_row_with_no_possible_token_fails_alone() -> None:
    scores = logits(3)
    allowed = torch.ones(3, VOCAB, dtype=torch.bool)
    allowed[1] = False  # a grammar that allows nothing: no distribution to draw from
    rows = [row(seed=1), row(seed=2), row(seed=3)]
    tokens, failed = draw(scores, rows, allowed)
    assert set(failed) == {1}
    # The others draw exactly what they would have drawn without the failing row.
    for i in (0, 2):
        alone, _ = draw(scores[i : i + 1], [row(seed=i + 1)])
        assert tokens[i] == alone[0]


def test_the_same_seed_gives_the_same_tokens_whatever_shares_the_batch() -> None:
    scores = logits(2)
    together, _ = draw(scores, [row(seed=5), row(temperature=1e-40, seed=9)])
    alone, _ = draw(scores[:1], [row(seed=5)])
    assert together[0] == alone[0]
