"""Dead letters: work items that will never succeed, kept for an operator to look at.

An item is buried when it has used up its `max_deliver` deliveries, or cannot be read at
all. Two ways lead here, so nothing loops and nothing waits for a deadline:

- a worker that failed it on its last delivery (the forward pass raised every time)
  buries it, answers its request, and terminates it;
- a worker that *died* holding it (a crash on that input, every time) cannot, so JetStream
  announces the exhausted item with a MAX_DELIVERIES advisory; one gateway (a queue
  group) takes the item from the stream, buries it, answers its request and deletes it.

Letters go to a limits stream (`{prefix}.dead.{model}`, kept `dead_max_age`), published
with message id `dead-<work stream seq>`, so the same item buried by both paths is kept
once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import Any

import msgspec

from ..config import NatsSettings
from .errors import QueueUnavailableError
from .messages import FailureCode, JobFailed, decode_job_header, encode
from .nats import Bus
from .source import Delivery
from .subjects import Subjects, token_model

__all__ = ["DeadLetter", "DeadLetters", "dead_letter_stream_config"]

log = logging.getLogger(__name__)

_ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.*"
_QUEUE_GROUP = "shoal-dead-letters"
_MAX_SCAN = 10_000


class DeadLetter(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One buried item: where it was going, why it died, and the item itself."""

    request_id: str = ""
    part: int = 0
    model: str = ""
    op: str = ""
    lane: str = ""
    reason: str
    """`max_deliver` (failed on every delivery), `worker_crashed` (its workers died
    holding it every time) or `undecodable`."""
    error: str = ""
    deliveries: int = 0
    worker_id: str = ""
    """The worker that buried it; empty when a gateway did (the workers had died)."""
    dead_at: float = 0.0
    work_seq: int = 0
    """Its sequence in the work stream."""
    item: bytes = b""
    """The item as queued (a payload-store reference if it was offloaded)."""


_decode_letter = msgspec.msgpack.Decoder(DeadLetter).decode


def dead_letter_stream_config(settings: NatsSettings, subjects: Subjects) -> dict[str, Any]:
    """A limits stream: letters stay `dead_max_age` seconds (or until `dead_max_bytes`,
    oldest dropped first), whether or not anyone reads them."""
    return {
        "name": settings.dead_stream,
        "subjects": [subjects.all_dead],
        "retention": "limits",
        "discard": "old",
        "max_age": settings.dead_max_age,
        "max_bytes": settings.dead_max_bytes,
        "storage": settings.storage,
        "num_replicas": settings.replicas,
        "duplicate_window": settings.duplicate_window,
    }


def _route(subject: str) -> tuple[str, str, str]:
    """(lane, model, op) of a work subject `{prefix}.work.{lane}.{model}.{op}`."""
    parts = subject.split(".")
    if len(parts) < 4:
        return "", "", ""
    try:
        return parts[-3], token_model(parts[-2]), parts[-1]
    except (ValueError, UnicodeDecodeError):
        return parts[-3], parts[-2], parts[-1]


class DeadLetters:
    """Burying items that will never succeed, answering their requests, and reading them back."""

    def __init__(self, bus: Bus, settings: NatsSettings, subjects: Subjects) -> None:
        self._bus = bus
        self._settings = settings
        self._subjects = subjects
        self._sub: Any = None

    async def bury(
        self,
        item: bytes,
        subject: str,
        work_seq: int,
        *,
        reason: str,
        error: str,
        deliveries: int,
        worker_id: str = "",
        code: FailureCode = FailureCode.INTERNAL,
        message: str = "",
    ) -> None:
        """Keep the item as a dead letter and answer its request with a failure of
        `code` (when its header reads; `message`, or one for the reason). Never raises: a
        letter that cannot be written is logged."""
        lane, model, op = _route(subject)
        try:
            header = decode_job_header(item)
        except msgspec.DecodeError:
            header = None
        letter = DeadLetter(
            request_id=header.request_id if header else "",
            part=header.part if header else 0,
            model=model,
            op=op,
            lane=lane,
            reason=reason,
            error=error,
            deliveries=deliveries,
            worker_id=worker_id,
            dead_at=time.time(),
            work_seq=work_seq,
            item=item,
        )
        log.error(
            "dead letter: %s part %d of %s (%s after %d deliveries): %s",
            letter.request_id or "?",
            letter.part,
            model or "?",
            reason,
            deliveries,
            error,
        )
        try:
            await self._bus.publish_once(
                self._subjects.dead(model or "unknown"), encode(letter), f"dead-{work_seq}"
            )
        except Exception as exc:
            log.error("could not keep the dead letter of %s: %r", letter.request_id, exc)
        if header is not None:
            failure = JobFailed(
                request_id=header.request_id,
                part=header.part,
                code=code,
                message=message or _FAILURE_MESSAGES.get(reason, "the work item failed"),
            )
            with contextlib.suppress(Exception):
                await self._bus.publish(header.reply_to, encode(failure))

    async def bury_delivery(
        self,
        delivery: Delivery,
        *,
        reason: str,
        error: str,
        worker_id: str,
        code: FailureCode = FailureCode.INTERNAL,
        message: str = "",
    ) -> None:
        """`bury` for an item a worker holds (the worker then terminates it)."""
        await self.bury(
            delivery.data,
            delivery.subject,
            delivery.stream_seq,
            reason=reason,
            error=error,
            deliveries=delivery.num_delivered,
            worker_id=worker_id,
            code=code,
            message=message,
        )

    # The gateway side: items whose workers died holding them ---------------------------

    async def watch_exhausted(self) -> None:
        """Bury items JetStream gave up redelivering (their workers kept dying). Every
        gateway subscribes; the queue group hands each advisory to one of them."""
        subject = _ADVISORY.format(stream=self._settings.stream)
        self._sub = await self._bus.subscribe(subject, self._on_advisory, queue=_QUEUE_GROUP)

    async def _on_advisory(self, payload: bytes) -> None:
        try:
            advisory = json.loads(payload)
            seq = int(advisory["stream_seq"])
            deliveries = int(advisory.get("deliveries", 0))
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable max-deliveries advisory: %r", payload[:200])
            return
        stream = self._settings.stream
        try:
            raw = await self._bus.stored(stream, seq)
        except QueueUnavailableError as exc:
            log.warning("cannot read exhausted item %d: %r", seq, exc)
            return
        if raw is None:
            return  # its worker settled it on the last delivery (and buried it if it failed)
        await self.bury(
            raw.data,
            raw.subject,
            seq,
            reason="worker_crashed",
            error=f"every worker that took it stopped without settling it ({deliveries} "
            "deliveries): it may crash the model",
            deliveries=deliveries,
        )
        with contextlib.suppress(Exception):
            await self._bus.delete_stored(stream, seq)

    # Reading them back ---------------------------------------------------------------

    async def recent(self, limit: int, model: str = "") -> list[tuple[int, DeadLetter]]:
        """Up to `limit` letters, newest first, as (letter seq, letter); only `model`'s
        if given (filtered while reading at most `_MAX_SCAN` letters back)."""
        stream = self._settings.dead_stream
        try:
            state = await self._bus.stream_state(stream)
        except QueueUnavailableError:
            return []  # no letters yet (the stream is made with the first)
        out: list[tuple[int, DeadLetter]] = []
        first, seq = max(1, state["first_seq"]), state["last_seq"]
        scanned = 0
        while seq >= first and len(out) < limit and scanned < _MAX_SCAN:
            scanned += 1
            raw = await self._bus.stored(stream, seq)
            seq -= 1
            if raw is None:  # deleted, or aged out meanwhile
                continue
            try:
                letter = _decode_letter(raw.data)
            except msgspec.DecodeError:
                continue
            if not model or letter.model == model:
                out.append((raw.seq, letter))
        return out

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()


_FAILURE_MESSAGES = {
    "max_deliver": "the model failed on this input on every attempt; it was kept as a "
    "dead letter for the operator",
    "worker_crashed": "every worker that ran this input stopped without an answer; it "
    "was kept as a dead letter for the operator",
    "undecodable": "the worker could not read this work item; it was kept as a dead letter",
}
