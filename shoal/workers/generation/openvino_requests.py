"""How a sequence request maps onto OpenVINO GenAI: its GenerationConfig fields, whether
the draft pipeline may decode it, whether it needs the transformers engine instead, and
its id in the pipeline."""

from __future__ import annotations

import hashlib

from .engine import SequenceRequest

__all__ = ["generation_fields", "may_assist", "needs_torch", "request_id"]

_SMALLEST_TOP_P = 1e-30  # a normal float32, far below any top_p that keeps two tokens
_SMALLEST_TEMPERATURE = 1e-30  # below it sampling is greedy in any float precision


def generation_fields(req: SequenceRequest) -> dict[str, object]:
    """The request's GenerationConfig, as fields the pipeline's process sets."""
    s = req.sampling
    fields: dict[str, object] = {"max_new_tokens": req.max_new, "ignore_eos": False}
    # OpenVINO holds temperature and top_p as float32, in which values below ~1e-38 are 0
    # and refused (or divide by zero). A temperature that small samples the likeliest
    # token with certainty: greedy; a top_p that small keeps only the likeliest token,
    # so the floor changes no answer.
    if s.temperature > _SMALLEST_TEMPERATURE:
        fields |= {
            "do_sample": True,
            "temperature": s.temperature,
            "top_p": max(s.top_p, _SMALLEST_TOP_P),
            "rng_seed": (s.seed + req.choice) % 2**63,
        }
    fields |= {"presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty}
    if s.logprobs:
        fields["logprobs"] = 1
    if s.json_schema:
        fields["json_schema"] = s.json_schema
    return fields


def may_assist(req: SequenceRequest) -> bool:
    """Whether a draft may propose this sequence's tokens: only where the full model's
    check alone picks each token (greedy), and where moving the sequence to the main
    pipeline midway, as a longer prompt, changes nothing: penalties count generated
    tokens only, a schema's grammar would start again. GenAI's assisted sampling failed
    its own checks when tried (2026.4.1)."""
    s = req.sampling
    return (
        s.temperature <= _SMALLEST_TEMPERATURE
        and not s.presence_penalty
        and not s.frequency_penalty
        and not s.json_schema
    )


def needs_torch(req: SequenceRequest) -> bool:
    """What GenAI cannot do per request in a step loop: LoRA, alternatives' logprobs."""
    return bool(req.adapter) or req.sampling.top_logprobs > 0


def request_id(req: SequenceRequest) -> int:
    return int.from_bytes(
        hashlib.blake2b(f"{req.job}:{req.choice}".encode(), digest_size=7).digest()
    )
