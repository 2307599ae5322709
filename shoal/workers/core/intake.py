"""Reading a pulled work item into its job, for every kind of worker.

An item's body is the job, or a reference to it in the payload store (an item too large
for one NATS message). What cannot become a job is settled here, and answered whenever
its header can be read, so no request waits for an item nobody will run:

| what                                   | reply                       | settle             |
|----------------------------------------|-----------------------------|--------------------|
| undecodable                            | failure; dead letter        | term               |
| offloaded, gone (its request is over)  | none                        | ack                |
| offloaded, store unreadable            | none; failure and dead      | nak (2 s); term    |
|                                        | letter on the last try      |                    |
"""

from __future__ import annotations

import contextlib
import logging

import msgspec

from ...queue import Delivery, FailureCode
from ...queue.dead_letters import DeadLetters
from ...queue.messages import Job
from ...queue.objects import ObjectNotFoundError, ObjectStoreError
from ...queue.payloads import PayloadStore

__all__ = ["read_job", "refuse"]

log = logging.getLogger(__name__)


async def read_job(
    payloads: PayloadStore,
    dead_letters: DeadLetters,
    delivery: Delivery,
    max_deliver: int,
    worker_id: str,
) -> Job | None:
    """The item's job; None when the item was settled here instead."""
    try:
        return await payloads.job_of(delivery.data)
    except msgspec.DecodeError as exc:
        log.error("undecodable work item (%d bytes): %s", len(delivery.data), exc)
        message = f"the worker could not read it: {exc}"
        await refuse(dead_letters, delivery, "undecodable", message, worker_id)
    except ObjectNotFoundError:
        with contextlib.suppress(Exception):
            await delivery.ack()
    except ObjectStoreError as exc:
        log.warning("an offloaded work item cannot be fetched: %s", exc)
        if delivery.num_delivered < max_deliver:
            with contextlib.suppress(Exception):
                await delivery.nak(2.0)
        else:
            message = f"the payload store cannot be read: {exc}"
            await refuse(
                dead_letters,
                delivery,
                "payload_unreadable",
                message,
                worker_id,
                code=FailureCode.UNAVAILABLE,
            )
    return None


async def refuse(
    dead_letters: DeadLetters,
    delivery: Delivery,
    reason: str,
    message: str,
    worker_id: str,
    code: FailureCode = FailureCode.INTERNAL,
) -> None:
    """Keep the item as a dead letter, answer its request with a failure if its header
    reads, then drop the item for good."""
    await dead_letters.bury_delivery(
        delivery, reason=reason, error=message, worker_id=worker_id, code=code, message=message
    )
    with contextlib.suppress(Exception):
        await delivery.term()
