"""How a held job ends: one outcome, one row of one table.

Every kind of worker reports what became of a job as an `Outcome`; `SETTLE` says what
the queue is told and what the requester hears. Nothing else settles a job.

| outcome     | when                                             | reply         | settle   |
|-------------|--------------------------------------------------|---------------|----------|
| ANSWERED    | the result (or the last chunk) was published     | the result    | ack      |
| EXPIRED     | its deadline passed before it ran                | failure       | ack      |
| INVALID     | it can never succeed as sent (too long, bad ids) | failure       | term     |
| NOT_FOUND   | it names what the worker lacks (an adapter)      | failure       | term     |
| UNAVAILABLE | the model cannot load or fit; no way to reply    | failure       | term     |
| INTERNAL    | post-processing failed                           | failure       | term     |
| CANCELLED   | its request was cancelled (client left)          | none          | ack      |
| FAILED      | the runtime failed on it, deliveries left        | none          | nak 1 s  |
|             | ... on its last delivery: a dead letter          | failure       | term     |
| RETURNED    | the worker stops, or stops serving its model     | none          | nak now  |
| UNSENT      | its reply could not be published                 | none          | none (*) |

(*) redelivered after `ack_wait`, and answered again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from ...queue import FailureCode

__all__ = ["SETTLE", "Outcome", "Settlement"]


class Outcome(enum.Enum):
    """How a held job ended (see the table above)."""

    ANSWERED = "answered"
    EXPIRED = "expired"
    INVALID = "invalid"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"
    CANCELLED = "cancelled"
    FAILED = "failed"
    RETURNED = "returned"
    UNSENT = "unsent"


@dataclass(frozen=True)
class Settlement:
    """What the queue is told (`ack`, `nak` after `delay` seconds, `term`, or nothing)
    and the failure the requester is sent, if any."""

    action: Literal["ack", "nak", "term", "none"]
    failure: FailureCode | None = None
    delay: float = 0.0


SETTLE: dict[Outcome, Settlement] = {
    Outcome.ANSWERED: Settlement("ack"),
    Outcome.EXPIRED: Settlement("ack", FailureCode.DEADLINE_EXCEEDED),
    Outcome.INVALID: Settlement("term", FailureCode.INVALID_INPUT),
    Outcome.NOT_FOUND: Settlement("term", FailureCode.NOT_FOUND),
    Outcome.UNAVAILABLE: Settlement("term", FailureCode.UNAVAILABLE),
    Outcome.INTERNAL: Settlement("term", FailureCode.INTERNAL),
    Outcome.CANCELLED: Settlement("ack"),
    # On its last delivery a FAILED job is kept as a dead letter instead (which answers
    # its request) and terminated: the worker core does that, not this row.
    Outcome.FAILED: Settlement("nak", delay=1.0),
    Outcome.RETURNED: Settlement("nak"),
    Outcome.UNSENT: Settlement("none"),
}
"""The one settle policy of every worker."""
