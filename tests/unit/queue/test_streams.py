import pytest

from shoal.queue.messages import ChoiceDelta, GenerateChunk, TokenLogprob
from shoal.queue.streams import StreamAssembler, StreamDivergedError


def chunk(attempt: str, seq: int, *deltas: ChoiceDelta, done: bool = False) -> GenerateChunk:
    return GenerateChunk(
        request_id="r",
        part=0,
        attempt=attempt,
        seq=seq,
        deltas=list(deltas),
        done=done,
        prompt_tokens=5,
        completion_tokens=3,
    )


def d(text: str, finish: str = "", index: int = 0, logprobs: int = 0) -> ChoiceDelta:
    lps = [TokenLogprob(token=f"t{i}", logprob=-1.0, bytes=[]) for i in range(logprobs)]
    return ChoiceDelta(index=index, text=text, finish_reason=finish, logprobs=lps)


def texts(deltas) -> str:
    return "".join(x.text for x in deltas)


def test_one_attempt_passes_through_and_drops_duplicates() -> None:
    a = StreamAssembler(0, 1)
    assert texts(a.feed(chunk("a", 0, d("Hel")))) == "Hel"
    assert a.feed(chunk("a", 0, d("Hel"))) == []  # duplicate seq
    out = a.feed(chunk("a", 1, d("lo", "stop"), done=True))
    assert texts(out) == "lo" and out[0].finish_reason == "stop"
    assert a.done and a.completion_tokens == 3


def test_a_redelivered_attempt_resumes_after_what_was_sent() -> None:
    a = StreamAssembler(0, 1)
    a.feed(chunk("a", 0, d("Hello", logprobs=2)))
    a.feed(chunk("a", 1, d(" wor", logprobs=1)))
    # The worker died; another one starts over under the same seed.
    assert a.feed(chunk("b", 0, d("Hello", logprobs=2))) == []
    out = a.feed(chunk("b", 1, d(" world", logprobs=2)))
    assert texts(out) == "ld"
    assert len(out[0].logprobs) == 1  # three were already sent
    assert a.feed(chunk("a", 2, d(" stale"))) == []  # the old attempt's stragglers


def test_a_redelivered_attempt_that_diverges_is_an_error() -> None:
    a = StreamAssembler(0, 1)
    a.feed(chunk("a", 0, d("Hello")))
    with pytest.raises(StreamDivergedError):
        a.feed(chunk("b", 0, d("Goodbye")))


def test_choices_are_tracked_separately_with_an_index_offset() -> None:
    a = StreamAssembler(2, 2)
    out = a.feed(chunk("a", 0, d("x", index=2), d("y", "length", index=3)))
    assert [(o.index, o.text, o.finish_reason) for o in out] == [(2, "x", ""), (3, "y", "length")]
