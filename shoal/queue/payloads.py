"""Messages too large for NATS travel through the object store instead.

NATS refuses a message over the server's `max_payload` (1 MiB by default). The gateway
already cuts requests into items far below it, so what remains is the rare item that
cannot be cut (one huge text, one huge document) and the rare reply that is too large.
Such a message is stored under `payloads/<request id>.<part>.<job|result>` and a
`PayloadRef` (request id, part, reply subject, key) travels in its place; whoever
receives the ref fetches the bytes. The gateway deletes a request's stored items once the request is
answered or abandoned (deadline, client gone), and a stored reply as soon as it has
read it. A store that cannot be written fails the request with a clear 503.
"""

from __future__ import annotations

import logging

from ..config import Settings
from .errors import PayloadStoreError
from .messages import Job, PayloadRef, decode_job, decode_job_message, encode
from .nats import Bus
from .objects import ObjectNotFoundError, ObjectStore, ObjectStoreError, open_object_store

__all__ = ["PayloadStore", "key_for", "open_payload_store"]

log = logging.getLogger(__name__)

HEADROOM = 16 << 10
"""Bytes kept free below the server's max_payload for headers and the subject."""


class PayloadStore:
    """Where work items and replies too large for one NATS message travel, a reference
    to them in the message instead."""

    def __init__(self, objects: ObjectStore, offload_bytes: int, max_payload: int) -> None:
        self.objects = objects
        self.limit = min(offload_bytes, max_payload - HEADROOM)
        """Messages longer than this go to the store."""

    @classmethod
    def on(cls, objects: ObjectStore, settings: Settings, bus: Bus) -> PayloadStore:
        """Over `objects`, with the settings' offload threshold and the connected
        server's message limit."""
        return cls(objects, settings.nats.offload_bytes, bus.max_payload)

    def fits(self, message: bytes) -> bool:
        return len(message) <= self.limit

    async def offload(
        self, message: bytes, request_id: str, part: int, reply_to: str, what: str
    ) -> tuple[bytes, str | None]:
        """`(message, None)` if it fits in one NATS message, else the encoded
        `PayloadRef` to it and the key it is stored under (`what`: "job" or "result").

        Raises:
            PayloadStoreError: the store could not take it.
        """
        if self.fits(message):
            return message, None
        key = key_for(request_id, part, what)
        try:
            await self.objects.put_bytes(key, message)
        except ObjectStoreError as exc:
            raise PayloadStoreError(f"the payload store could not take {key}: {exc}") from exc
        ref = PayloadRef(
            request_id=request_id, part=part, reply_to=reply_to, key=key, size=len(message)
        )
        return encode(ref), key

    async def fetch(self, ref: PayloadRef) -> bytes:
        """The stored message.

        Raises:
            ObjectNotFoundError: gone (its request was answered or abandoned).
            ObjectStoreError: the store cannot be read now.
        """
        data = await self.objects.get_bytes(ref.key)
        if len(data) != ref.size:
            raise ObjectStoreError(f"{ref.key} holds {len(data)} bytes, not {ref.size}")
        return data

    async def job_of(self, data: bytes) -> Job:
        """The job a work item's body carries, fetched from the store if offloaded.

        Raises:
            msgspec.DecodeError: not a job.
            ObjectNotFoundError: offloaded, and gone (its request is over).
            ObjectStoreError: offloaded, and the store cannot be read now.
        """
        message = decode_job_message(data)
        if isinstance(message, PayloadRef):
            return decode_job(await self.fetch(message))
        return message

    async def discard(self, keys: list[str]) -> None:
        """Delete stored messages; failures are logged, never raised (cleanup)."""
        for key in keys:
            try:
                await self.objects.delete(key)
            except ObjectNotFoundError:
                pass
            except ObjectStoreError as exc:
                log.warning("could not delete payload %s: %s", key, exc)


def open_payload_store(settings: Settings, bus: Bus) -> PayloadStore:
    """The store the settings' `objects` pick (the gateway's files live there too), with
    the offload threshold from the settings and the connected server."""
    objects = open_object_store(settings.objects, settings.s3, settings.data_dir)
    return PayloadStore.on(objects, settings, bus)


def key_for(request_id: str, part: int, what: str) -> str:
    return f"payloads/{request_id}.{part}.{what}"
