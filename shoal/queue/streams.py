"""Turning a generation job's chunks into what its client sees, exactly once.

A worker streams `GenerateChunk`s numbered by `seq` within its `attempt`. If it dies, the
job is redelivered and another worker starts a new attempt from scratch, under the same
seed. `StreamAssembler` then switches to the new attempt (at its `seq` 0), drops the old
one's stragglers and duplicates, and forwards only text beyond what the client already
has, after checking the new attempt reproduced that text; if it did not, the stream
cannot continue honestly and `StreamDivergedError` ends it.
"""

from __future__ import annotations

from .messages import ChoiceDelta, GenerateChunk

__all__ = ["StreamAssembler", "StreamDivergedError"]


class StreamDivergedError(Exception):
    """A redelivered attempt generated text other than what was already sent."""


class StreamAssembler:
    """Turns one job's generation chunks into deltas, once each, across redeliveries."""

    def __init__(self, first_index: int, n: int) -> None:
        self._first = first_index
        self._sent = [""] * n
        self._sent_logprobs = [0] * n
        self._finished = [False] * n
        self._attempt: str | None = None
        self._next_seq = 0
        self._text = [""] * n
        self._logprobs = [0] * n
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.prompt = ""
        self.done = False

    def feed(self, chunk: GenerateChunk) -> list[ChoiceDelta]:
        """The client-facing deltas `chunk` adds (possibly none).

        Raises:
            StreamDivergedError: see the module doc.
        """
        if chunk.attempt != self._attempt:
            if chunk.seq != 0 and self._attempt is not None:
                return []  # a straggler from an abandoned attempt
            self._attempt = chunk.attempt
            self._next_seq = 0
            self._text = [""] * len(self._text)
            self._logprobs = [0] * len(self._logprobs)
        if chunk.seq < self._next_seq:
            return []  # a duplicate
        self._next_seq = chunk.seq + 1
        if chunk.prompt:
            self.prompt = chunk.prompt
        out = [d for d in (self._delta(delta) for delta in chunk.deltas) if d is not None]
        if chunk.done:
            self.prompt_tokens = chunk.prompt_tokens
            self.completion_tokens = chunk.completion_tokens
            self.done = True
        return out

    def _delta(self, delta: ChoiceDelta) -> ChoiceDelta | None:
        i = delta.index - self._first
        text = self._text[i] = self._text[i] + delta.text
        sent = self._sent[i]
        if len(text) <= len(sent):
            if not sent.startswith(text) or (delta.finish_reason and text != sent):
                raise StreamDivergedError(f"choice {delta.index} diverged on redelivery")
            new_text = ""
        else:
            if not text.startswith(sent):
                raise StreamDivergedError(f"choice {delta.index} diverged on redelivery")
            new_text = text[len(sent) :]
            self._sent[i] = text
        before = self._logprobs[i]
        self._logprobs[i] += len(delta.logprobs)
        skip = max(0, self._sent_logprobs[i] - before)
        logprobs = delta.logprobs[skip:]
        self._sent_logprobs[i] = max(self._sent_logprobs[i], self._logprobs[i])
        finish = ""
        if delta.finish_reason and not self._finished[i]:
            self._finished[i] = True
            finish = delta.finish_reason
        if not new_text and not logprobs and not finish:
            return None
        return ChoiceDelta(
            index=delta.index, text=new_text, logprobs=logprobs, finish_reason=finish
        )
