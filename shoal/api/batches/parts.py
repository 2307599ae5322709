"""A batch's progress as it is saved: parts of finished lines in the object store.

The runner saves what finished every `flush_seconds` as one part
(`batches/<id>/parts/<epoch>-<seq>`): a restarted runner reads the parts to know which
lines are done, and finalizing joins them into the output and error files, keeping the
first outcome of a line and dropping any repeat (a line answered by two owners of the
batch, one of which lost its lease). Every `custom_id` is thus in the output exactly once.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator
from typing import NamedTuple

import msgspec

from ...compat.openai.batches import BatchOutputError, BatchOutputLine, BatchOutputResponse
from ...queue.objects import ObjectStore, ObjectStoreError
from ..json_lines import one_line

__all__ = ["LineOutcome", "PartWriter", "load_parts", "part_prefix", "render", "save_part"]

log = logging.getLogger(__name__)

NO_RESPONSE = 0
"""`LineOutcome.status` of a line that never got a response (expired): `body` is the error."""


class LineOutcome(NamedTuple):
    index: int
    """The line's position among the file's non-blank lines, from 0."""
    custom_id: str
    status: int
    body: bytes
    """The JSON response body, or for NO_RESPONSE the JSON `{code, message}` error."""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(list[LineOutcome]).decode


def part_prefix(batch_id: str) -> str:
    return f"batches/{batch_id}/parts/"


async def save_part(
    objects: ObjectStore, batch_id: str, epoch: int, seq: int, outcomes: list[LineOutcome]
) -> None:
    await objects.put_bytes(f"{part_prefix(batch_id)}{epoch:06d}-{seq:08d}", _encode(outcomes))


class PartWriter:
    """One owner's finished lines not saved yet, saved as parts of its epoch."""

    def __init__(self, objects: ObjectStore, batch_id: str, epoch: int) -> None:
        self.objects = objects
        self.batch_id = batch_id
        self.epoch = epoch
        self.pending: list[LineOutcome] = []
        self._seq = 0

    def add(self, outcome: LineOutcome) -> None:
        self.pending.append(outcome)

    async def flush(self) -> bool:
        """Save the pending lines as a new part. False if the store failed; the lines
        stay pending then, as they do when the save is cancelled."""
        if not self.pending:
            return True
        outcomes, self.pending = self.pending, []
        # A part key is never reused: a write cut off here (cancelled, or failed after
        # the store took it) may still land, and a later part under the same key would
        # overwrite it. A line saved twice is harmless: readers keep its first outcome.
        seq, self._seq = self._seq, self._seq + 1
        try:
            await save_part(self.objects, self.batch_id, self.epoch, seq, outcomes)
        except BaseException as exc:
            self.pending = outcomes + self.pending
            if not isinstance(exc, ObjectStoreError):
                raise
            log.warning("batch %s: saving progress failed, retrying: %s", self.batch_id, exc)
            return False
        return True


async def load_parts(objects: ObjectStore, batch_id: str) -> AsyncIterator[list[LineOutcome]]:
    for key in await objects.list(part_prefix(batch_id)):
        yield _decode(await objects.get_bytes(key))


def request_id(batch_id: str, index: int) -> str:
    digest = hashlib.blake2b(f"{batch_id}:{index}".encode(), digest_size=12).hexdigest()
    return f"batch_req_{digest}"


def render(batch_id: str, outcome: LineOutcome) -> bytes:
    """The outcome as one line of OpenAI's output/error file format."""
    rid = request_id(batch_id, outcome.index)
    if outcome.status == NO_RESPONSE:
        error = msgspec.json.decode(outcome.body, type=BatchOutputError)
        line = BatchOutputLine(id=rid, custom_id=outcome.custom_id, response=None, error=error)
    else:
        response = BatchOutputResponse(
            status_code=outcome.status, request_id=rid, body=msgspec.Raw(outcome.body)
        )
        line = BatchOutputLine(id=rid, custom_id=outcome.custom_id, response=response, error=None)
    return one_line(line) + b"\n"
