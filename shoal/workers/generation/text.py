"""Token ids to text as they are generated: incremental detokenization and stop strings.

Detokenizing the whole output again after every token costs O(n^2); instead the text of
a short window is decoded twice (as vLLM and TGI do) and only the difference emitted,
holding back an incomplete UTF-8 sequence. Stop strings are never emitted: text that
might be the start of a stop string is held back until it is not, and generation ends
at the first occurrence of one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["TextTracker"]


class TextTracker:
    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Sequence[str]) -> None:
        self._decode = decode
        self._stops = [s for s in stops if s]
        self._longest = max((len(s) for s in self._stops), default=0)
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self.text = ""
        """Everything decoded so far (cut at a stop string once one is found)."""
        self._emitted = 0
        self.stopped = False

    def add(self, token_id: int) -> str:
        """Append one token; returns the text that is now safe to send."""
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self._prefix = self._read
            self._read = len(self._ids)
        return self._release()

    def finish(self) -> str:
        """Generation ended (EOS or length): whatever is held back is safe now."""
        if not self.stopped:
            rest = self._decode(self._ids[self._prefix :])
            before = self._decode(self._ids[self._prefix : self._read])
            if len(rest) > len(before):
                self.text += rest[len(before) :]
        out = self.text[self._emitted :]
        self._emitted = len(self.text)
        return out

    def _release(self) -> str:
        if self._stops:
            start = max(0, self._emitted - self._longest)
            hits = [i for i in (self.text.find(s, start) for s in self._stops) if i >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
                out = self.text[self._emitted :]
                self._emitted = len(self.text)
                return out
        safe = len(self.text) - self._held_back()
        out = self.text[self._emitted : safe] if safe > self._emitted else ""
        self._emitted = max(self._emitted, safe)
        return out

    def _held_back(self) -> int:
        """Length of the longest end of the text that begins some stop string."""
        for size in range(min(self._longest, len(self.text)), 0, -1):
            tail = self.text[-size:]
            if any(s.startswith(tail) for s in self._stops):
                return size
        return 0
