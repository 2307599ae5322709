"""JSON-schema constrained decoding with llguidance (the engine SGLang and vLLM use too).

Each constrained sequence has a matcher: before every token it says which tokens keep
the output valid, and after it consumes the chosen one. `json_object` is the schema
`{"type": "object"}`.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["Grammar", "GrammarFactory"]


class Grammar:
    def __init__(self, matcher) -> None:
        self._matcher = matcher

    def allowed(self, width: int) -> torch.Tensor:
        """Which of the first `width` token ids may come next."""
        mask = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint32)
        bits = np.unpackbits(mask.view(np.uint8), bitorder="little").astype(bool)
        out = torch.zeros(width, dtype=torch.bool)
        n = min(width, len(bits))
        out[:n] = torch.from_numpy(bits[:n])
        return out

    def consume(self, token: int) -> None:
        self._matcher.consume_token(token)

    @property
    def done(self) -> bool:
        return self._matcher.is_stopped()


class GrammarFactory:
    """Matchers for one tokenizer (building llguidance's view of it takes a moment)."""

    def __init__(self, hf_tokenizer) -> None:
        import llguidance.hf

        self._tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer)

    def __call__(self, schema: str) -> Grammar:
        from llguidance import LLMatcher

        grammar = LLMatcher.grammar_from_json_schema(schema)
        return Grammar(LLMatcher(self._tokenizer, grammar))
