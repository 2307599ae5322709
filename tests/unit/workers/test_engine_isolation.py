"""A sequence whose sampling fails fails only its own job: the engine (on its thread, with
a fake causal LM) keeps generating for the sequences it shares a batch with."""

from __future__ import annotations

import queue
from types import SimpleNamespace

import torch

from shoal.queue.messages import Sampling
from shoal.workers.generation.engine import Engine, SequenceRequest, TokenEvent

VOCAB = 16
EOS = 0


class FakeLM(torch.nn.Module):
    """Always favours token 1 + (last input id % 7); never ends a sequence by itself."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(vocab_size=VOCAB)
        self.generation_config = SimpleNamespace(eos_token_id=EOS)

    def forward(
        self, input_ids, attention_mask, position_ids, use_cache, logits_to_keep, cache=None
    ):
        rows, width = input_ids.shape[0], attention_mask.shape[1]
        logits = torch.zeros(rows, 1, VOCAB)
        favoured = 1 + input_ids[:, -1] % 7
        logits[torch.arange(rows), 0, favoured] = 5.0
        logits[:, 0, EOS] = -100.0
        layer = SimpleNamespace(
            keys=torch.zeros(rows, 1, width, 1), values=torch.zeros(rows, 1, width, 1)
        )
        return SimpleNamespace(logits=logits, cache=SimpleNamespace(layers=[layer]))


class Tokenizer:
    eos_token_id = EOS
    pad_token_id = EOS

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


class NothingAllowed:
    """A grammar that allows no token: there is no distribution left to sample from."""

    done = False

    def allowed(self, width: int) -> torch.Tensor:
        return torch.zeros(width, dtype=torch.bool)

    def consume(self, token: int) -> None:
        raise AssertionError("no token may be consumed")


def test_a_failing_sequence_fails_only_its_job() -> None:
    events: queue.Queue[TokenEvent] = queue.Queue()
    engine = Engine(
        FakeLM(),
        Tokenizer(),
        context=64,
        max_running=8,
        on_events=lambda batch: [events.put(e) for e in batch],
        grammar_factory=lambda schema: NothingAllowed(),  # type: ignore[arg-type,return-value]
    )
    sampling = Sampling(max_tokens=6, temperature=1.0, seed=3)
    broken = Sampling(max_tokens=6, temperature=1.0, seed=3, json_schema='{"type": "object"}')
    engine.start()
    try:
        engine.submit(
            [
                SequenceRequest("good", 0, [3], 6, sampling),
                SequenceRequest("bad", 0, [3], 6, broken),
                SequenceRequest("bad", 1, [3], 6, broken),
                SequenceRequest("good", 1, [4], 6, sampling),
            ]
        )
        seen: dict[tuple[str, int], list[TokenEvent]] = {}
        while sum(1 for k, v in seen.items() if k[0] == "good" and v[-1].finish) < 2:
            event = events.get(timeout=30)
            seen.setdefault((event.job, event.choice), []).append(event)
    finally:
        engine.stop()
    bad = [e for (job, _), evs in seen.items() if job == "bad" for e in evs]
    assert len(bad) == 1 and "sampling failed" in bad[0].error  # one error for the job
    for choice in (0, 1):
        good = seen[("good", choice)]
        assert not any(e.error for e in good)
        assert sum(e.generated for e in good) == 6 and good[-1].finish == "length"
    assert engine.running == 0
