"""Reading a pulled work item into its job, for every kind of worker.

An item's body is the job, or a reference to it in the payload store (an item too large
for one NATS message). What cannot become a job is settled here, and answered whenever
its header can be read, so no request waits for an item nobody will run:

| what                                   | reply                       | settle             |
|----------------------------------------|-----------------------------|--------------------|
| undecodable                            | failure                     | term               |
| offloaded, gone (its request is over)  | none                        | ack                |
| offloaded, store unreadable            | none; failure on last try   | nak (2 s); term    |
"""

from __future__ import annotations

import contextlib
import logging

import msgspec

from ..queue import Bus, Delivery, ErrorKind, JobFailed
from ..queue.messages import Job, decode_job_header, encode
from ..queue.objects import ObjectNotFoundError, ObjectStoreError
from ..queue.payloads import PayloadStore

__all__ = ["read_job", "refuse"]

log = logging.getLogger(__name__)


async def read_job(
    payloads: PayloadStore, bus: Bus, delivery: Delivery, max_deliver: int
) -> Job | None:
    """The item's job; None when the item was settled here instead."""
    try:
        return await payloads.job_of(delivery.data)
    except msgspec.DecodeError as exc:
        log.error("undecodable work item (%d bytes): %s", len(delivery.data), exc)
        await refuse(bus, delivery, ErrorKind.INTERNAL, f"the worker could not read it: {exc}")
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
            await refuse(bus, delivery, ErrorKind.UNAVAILABLE, message)
    return None


async def refuse(bus: Bus, delivery: Delivery, kind: ErrorKind, message: str) -> None:
    """Answer the item's request with a failure if its header reads, then drop the item
    for good."""
    try:
        header = decode_job_header(delivery.data)
    except msgspec.DecodeError:
        header = None
    if header is not None:
        failure = JobFailed(
            request_id=header.request_id, part=header.part, kind=kind, message=message
        )
        with contextlib.suppress(Exception):
            await bus.publish(header.reply_to, encode(failure))
    with contextlib.suppress(Exception):
        await delivery.term()
