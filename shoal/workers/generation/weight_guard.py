"""Whether a generation model's served weights still answer like its float32 reference.

Every tier but float32 (precision.py) is compared, before it serves, with the float32
model of the same checkpoint on `PROBE_CHATS`: each question through the
chat template, followed by a plain answer, both models read the whole sequence at once
(teacher forcing), and at every answer position we ask whether they pick the same next
token (top-1 agreement) and how far apart their next-token distributions are (mean KL
divergence, nats). Teacher forcing measures each position on its own: a greedy answer
compared whole would count one early flip as a wholly different answer (SmolLM2-135M in
int8: 0 of 10 whole answers equal, 0.95 of positions agreeing on those same answers).

The result is stored beside the compressed IR, so the check runs once per export.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np

from ...queue.messages import ChatTurn
from .runtime import chat_prompt_ids

__all__ = [
    "EXACT",
    "PROBE_CHATS",
    "Agreement",
    "agreement",
    "position_scores",
    "probe_sequences",
    "read_through_cache",
    "teacher_forced",
]

EXACT = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
}
"""OpenVINO compile properties of the float32 reference: float32 arithmetic throughout."""

PROBE_CHATS = (
    ("What is the capital of France?", "The capital of France is Paris."),
    (
        "Write two sentences about coral reefs.",
        "Coral reefs are home to a quarter of all marine species. They protect coasts "
        "from waves and storms.",
    ),
    (
        "How do I reverse a list in Python?",
        "Use slicing, as in items[::-1], which returns a new list, or call items.reverse() "
        "to reverse the list in place.",
    ),
    (
        "Why is the sky blue?",
        "Sunlight is scattered by the molecules of the air, and blue light, with its short "
        "wavelength, is scattered much more than red light.",
    ),
    (
        "Give me three tips for better sleep.",
        "1. Go to bed at the same time every night.\n2. Keep your bedroom cool and dark.\n"
        "3. Avoid caffeine in the afternoon.",
    ),
    (
        "Summarize the water cycle in one sentence.",
        "Water evaporates from oceans and lakes, condenses into clouds, falls as rain or "
        "snow, and flows back to the sea.",
    ),
    (
        "What is 12 times 7?",
        "12 times 7 is 84.",
    ),
    (
        "Describe a cat to someone who has never seen one.",
        "A cat is a small furry animal with four legs, a long tail, pointed ears and "
        "whiskers. It moves quietly, likes to sleep in warm places and purrs when it is "
        "content.",
    ),
)


class Agreement(msgspec.Struct, frozen=True):
    top1: float
    """Share of answer positions where both models pick the same next token."""
    kl: float
    """Mean KL divergence of the compressed model's next-token distribution from the full
    one's, in nats."""
    positions: int


def probe_sequences(tokenizer) -> list[tuple[list[int], int]]:
    """Each probe chat as (token ids, where its answer starts)."""
    out = []
    for question, answer in PROBE_CHATS:
        try:
            prompt = chat_prompt_ids(tokenizer, [ChatTurn(role="user", content=question)], "")
        except ValueError:  # no chat template: a completion model reads plain text
            prompt = chat_prompt_ids(tokenizer, [], f"{question}\n")
        answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
        out.append((prompt + list(answer_ids), len(prompt)))
    return out


def agreement(
    full: Path,
    compressed: Path,
    sequences: Sequence[tuple[list[int], int]],
    properties: dict[str, object],
) -> Agreement:
    """Compare two OpenVINO IRs (optimum's stateful causal-LM export, or one rebuilt from
    it) on `sequences`: `full` compiled with `EXACT`, `compressed` with the `properties`
    it serves with; the result is cached in `compressed`, keyed by both."""
    served = json.dumps(sorted((k, str(v)) for k, v in properties.items()))
    key = hashlib.sha256(f"{json.dumps(list(sequences))}|{served}".encode()).hexdigest()[:16]
    stored = compressed / "agreement.json"
    try:
        cached = json.loads(stored.read_text())
        if cached.get("key") == key:
            return msgspec.convert(cached["agreement"], Agreement)
    except (OSError, ValueError, KeyError, msgspec.ValidationError):
        pass
    threads = {k: v for k, v in properties.items() if k == "INFERENCE_NUM_THREADS"}
    a = _answer_logits(full, sequences, EXACT | threads)
    b = _answer_logits(compressed, sequences, properties)
    scores = [position_scores(x, y) for x, y in zip(a, b, strict=True)]
    same = np.concatenate([agree for agree, _ in scores])
    kl = np.concatenate([divergence for _, divergence in scores])
    result = Agreement(top1=float(same.mean()), kl=float(kl.mean()), positions=int(same.size))
    partial = stored.with_name(f"{stored.name}.{os.getpid()}")
    partial.write_text(json.dumps({"key": key, "agreement": msgspec.to_builtins(result)}))
    partial.replace(stored)  # whole or absent, with two workers checking at once
    return result


def _answer_logits(ir: Path, sequences, properties: dict[str, object]) -> list[np.ndarray]:
    """Next-token logits at every answer position."""
    import openvino as ov

    compiled = ov.Core().compile_model(str(ir / "openvino_model.xml"), "CPU", properties)
    # Position i predicts token i + 1: the answer's tokens are predicted from start - 1.
    return [teacher_forced(compiled, ids)[start - 1 :] for ids, start in sequences]


def teacher_forced(compiled, ids: list[int]) -> np.ndarray:
    """The next-token logits (float64) a compiled stateful causal-LM graph gives at every
    position of `ids` but the last, read in one fresh pass."""
    request = compiled.create_infer_request()
    request.reset_state()
    return _feed(compiled, request, ids, 0)[:-1]


def read_through_cache(compiled, ids: list[int], start: int) -> np.ndarray:
    """The next-token logits for `ids[start:]` (rows `start - 1` to the last but one of
    `teacher_forced`), read as generation reads them: `ids[:start]` in one pass, then one
    token a step, each step attending to the graph's KV cache. (One pass over a whole
    sequence attends to the fresh keys and values, so it never reads a narrower cache's
    precision back: perf kv-cache.)"""
    request = compiled.create_infer_request()
    request.reset_state()
    rows = [_feed(compiled, request, ids[:start], 0)[-1]]
    rows += [_feed(compiled, request, [ids[i]], i)[-1] for i in range(start, len(ids) - 1)]
    return np.stack(rows)


def _feed(compiled, request, tokens: list[int], past: int) -> np.ndarray:
    """The next-token logits (float64) at each of `tokens`, fed after `past` positions
    already in the request's state."""
    chunk = np.asarray([tokens], dtype=np.int64)
    feed = {
        "input_ids": chunk,
        "attention_mask": np.ones((1, past + len(tokens)), dtype=np.int64),
        "position_ids": np.arange(past, past + len(tokens), dtype=np.int64)[None],
        "beam_idx": np.zeros(1, dtype=np.int32),
    }
    # optimum exports position_ids (and beam_idx) only for some architectures.
    accepted = {name for port in compiled.inputs for name in port.get_names()}
    request.infer({name: value for name, value in feed.items() if name in accepted})
    return np.array(request.get_tensor("logits").data[0], dtype=np.float64)


def position_scores(reference: np.ndarray, served: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position (rows of next-token logits): whether both pick the same token, and the
    KL divergence of `served`'s distribution from `reference`'s (nats)."""
    return reference.argmax(-1) == served.argmax(-1), _kl(reference, served)


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    log_p = _log_softmax(p_logits)
    log_q = _log_softmax(q_logits)
    return (np.exp(log_p) * (log_p - log_q)).sum(-1)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))
