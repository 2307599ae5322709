"""The spans of a traced encoder job: tokenize, batch wait, forward and publish, recorded
once the job is answered (times kept on the held job as its batches run)."""

from __future__ import annotations

from ..observe import record_job_spans
from .held import EncoderHeld, Unit, jobs_of

__all__ = ["note_forward", "record_spans"]


def note_forward(batch: list[Unit], started: float, ended: float, tokens: int) -> None:
    """Keep each traced job's forward-pass times (its first batch's start, last's end)
    and the size of its last batch."""
    for held in jobs_of(batch):
        if held.trace is not None:
            held.forward_started = held.forward_started or started
            held.forward_ended = ended
            held.batch_seen = (len(batch), tokens)


def record_spans(held: EncoderHeld, model: str, publish_started: float, ended: float) -> None:
    assert held.trace is not None
    job = held.job
    attributes = {"shoal.model": model, "shoal.op": held.op, "shoal.request_id": job.request_id}
    forward = {
        "shoal.inputs": len(held.tokens),
        "shoal.tokens": held.prompt_tokens,
        "shoal.batch.size": held.batch_seen[0],
        "shoal.batch.tokens": held.batch_seen[1],
    }
    record_job_spans(
        held.trace,
        held.delivery.published_at,
        held.pulled_at,
        ended,
        attributes,
        [
            ("shoal.tokenize", held.pulled_at, held.queued_at, {}),
            ("shoal.batch.wait", held.queued_at, held.forward_started, {}),
            ("shoal.forward", held.forward_started, held.forward_ended, forward),
            ("shoal.result.publish", publish_started, ended, {}),
        ],
    )
