"""One batch, worked through by the runner that holds its lease (runner.py says how)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from ...compat.errors import InternalError, ShoalError
from ...compat.openai.batches import BatchError, BatchErrors, RequestCounts
from ...config import BatchSettings
from ...queue.objects import ObjectStoreError
from ..admission import Admission, current_principal
from ..answer import BATCH_ENDPOINTS
from ..batch_store import BatchRecord, BatchStore, LeaseLostError
from ..endpoints import route_group
from ..json_lines import one_line
from .lines import InputLine, LineError, TooLong, check_line, custom_id_of, input_lines, validate
from .packing import Pack, PackedLine, packed_line
from .parts import NO_RESPONSE, LineOutcome, PartWriter, load_parts, part_prefix, render

if TYPE_CHECKING:
    from ..gateway import Gateway

__all__ = ["BatchRun", "Runner"]


class Runner(Protocol):
    """What a run uses of the runner that holds its lease (runner.py's `BatchRunner`):
    named here so that a run needs no import of the runner, which imports it."""

    runner_id: str
    settings: BatchSettings
    store: BatchStore
    gateway: Gateway
    admission: Admission


log = logging.getLogger(__name__)

_encode = msgspec.json.Encoder().encode
_RETRYABLE = frozenset({429, 502, 503, 504})
T = TypeVar("T")


class BatchRun:
    """One runner's work on one batch, while it holds the lease: validate, execute,
    finalize (see runner.py)."""

    def __init__(self, runner: Runner, record: BatchRecord) -> None:
        self.runner = runner
        self.settings = runner.settings
        self.store = runner.store
        self.files = runner.gateway.files
        self.objects = runner.gateway.files.objects
        self.batch = record.batch
        self.id = record.batch.id
        self.epoch = record.epoch
        self.owner = runner.runner_id
        self.creator = record.creator
        self.endpoint = BATCH_ENDPOINTS[record.batch.endpoint]
        self.group = route_group(record.batch.endpoint) or ""
        """The route group a line's live request would be checked against."""
        self.gateway = runner.gateway.on_batch_lane(self.settings.item_timeout)
        self.stop_reason = "cancelled" if record.batch.status == "cancelling" else ""
        self.stopped = asyncio.Event()
        if self.stop_reason:
            self.stopped.set()
        self.done = bytearray()
        self.counts = RequestCounts(total=record.batch.request_counts.total)
        self.parts = PartWriter(self.objects, self.id, self.epoch)
        limits = runner.gateway.settings.gateway
        self.pack_inputs = min(self.settings.pack_inputs, limits.max_inputs)

    # Lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        main = asyncio.current_task()
        assert main is not None
        if self.creator:  # its lines may use only what the creating key may (this task's context)
            current_principal.set(self.runner.admission.keys.named(self.creator))
        keeper = asyncio.create_task(self._keep_lease(main))
        try:
            if self.batch.status == "validating" and not await self._validate():
                return
            if not self.stop_reason:
                await self._execute()
            await self._finalize()
        except asyncio.CancelledError:
            log.info("batch %s: runner %s let go of it", self.id, self.owner)
            raise
        except LeaseLostError:
            log.warning("batch %s: lease lost to another runner", self.id)
        except Exception:
            log.exception("batch %s: runner failed; it resumes at the next claim", self.id)
        finally:
            keeper.cancel()

    def _stop(self, reason: str) -> None:
        if not self.stop_reason:
            log.info("batch %s: stopping (%s)", self.id, reason)
            self.stop_reason = reason
            self.stopped.set()

    async def _keep_lease(self, main: asyncio.Task) -> None:
        lease = self.settings.lease_seconds
        while True:
            await asyncio.sleep(min(1.0, lease / 3))
            try:
                record = await self.store.change(self.id, self._renewed, owner=self.owner)
            except LeaseLostError:
                main.cancel()
                return
            except Exception as exc:
                log.warning("batch %s: renewing the lease failed: %r", self.id, exc)
                continue
            if record.batch.status == "cancelling":
                self._stop("cancelled")
            elif record.batch.expires_at and time.time() >= record.batch.expires_at:
                self._stop("expired")

    def _renewed(self, record: BatchRecord) -> BatchRecord:
        return msgspec.structs.replace(
            record, lease_until=time.time() + self.settings.lease_seconds
        )

    async def _update(self, **batch_fields) -> BatchRecord:
        def change(record: BatchRecord) -> BatchRecord:
            batch = msgspec.structs.replace(record.batch, **batch_fields)
            return msgspec.structs.replace(
                record, batch=batch, lease_until=time.time() + self.settings.lease_seconds
            )

        record = await self.store.change(self.id, change, owner=self.owner)
        self.batch = record.batch
        return record

    def _lines(self) -> AsyncIterator[InputLine]:
        chunks = self.objects.get(f"files/{self.batch.input_file_id}")
        return input_lines(chunks, self.settings.max_line_bytes)

    # Validating ------------------------------------------------------------------------

    async def _validate(self) -> bool:
        checked = await validate(
            self._lines,
            self.batch.endpoint,
            self.endpoint,
            lambda model, op: self.gateway.resolve(model, op),
            self.settings.max_validation_errors,
        )
        now = int(time.time())
        self.counts = RequestCounts(total=checked.total)
        if checked.total == 0:
            await self._update(
                status="failed",
                failed_at=now,
                errors=BatchErrors(data=[_empty_file_error()]),
                request_counts=self.counts,
            )
            return False
        if checked.error_count:
            lines = (one_line(error) + b"\n" for error in checked.errors)
            error_file = await self.files.add(
                f"{self.id}_validation_errors.jsonl",
                "batch_output",
                _aiter(lines),
                file_id=f"file-{self.id}-errors",
                owner=self.creator,
            )
            await self._update(
                status="failed",
                failed_at=now,
                errors=BatchErrors(data=checked.errors),
                error_file_id=error_file.id,
                request_counts=self.counts,
            )
            log.info("batch %s: failed validation (%d bad lines)", self.id, checked.error_count)
            return False
        model = next(iter(checked.models)) if len(checked.models) == 1 else None
        await self._update(
            status="in_progress", in_progress_at=now, request_counts=self.counts, model=model
        )
        return True

    # Executing -------------------------------------------------------------------------

    async def _execute(self) -> None:
        total = self.counts.total
        await self._count_saved()
        if self.counts.completed + self.counts.failed:
            log.info(
                "batch %s: resuming with %d of %d lines done",
                self.id,
                self.counts.completed + self.counts.failed,
                total,
            )
        room = asyncio.Semaphore(self.settings.max_in_flight)
        running: set[asyncio.Task] = set()

        def send(answer: Coroutine[Any, Any, list[LineOutcome]], lines: int) -> None:
            """Run `answer`, which holds `lines` places in flight until it is done."""
            task = asyncio.create_task(self._run(answer, room, lines))
            running.add(task)
            task.add_done_callback(running.discard)

        saver = asyncio.create_task(self._save_periodically())
        try:
            pack: Pack | None = None
            index = -1
            async for _, raw in self._lines():
                index += 1
                if index >= total or self.stopped.is_set():
                    break
                if self.done[index]:
                    continue
                if room.locked() and pack is not None:  # the pack holds the last places
                    send(self._answer_pack(pack), len(pack.lines))
                    pack = None
                if not await self._acquire(room):
                    break
                line = self._packable(index, raw)
                if line is not None and pack is not None and pack.offer(line):
                    continue
                if pack is not None:
                    send(self._answer_pack(pack), len(pack.lines))
                    pack = None
                if line is not None:
                    pack = Pack(line, self.pack_inputs)
                else:
                    send(self._answer_one(index, raw), 1)
            if pack is not None and not self.stopped.is_set():
                send(self._answer_pack(pack), len(pack.lines))
            await self._drain(running)
        finally:
            for task in running:
                task.cancel()
            saver.cancel()
            # A save cut off by the cancel puts its lines back to pending: wait for
            # that before the last save, so no finished line is left out of every part.
            await asyncio.gather(saver, return_exceptions=True)
        await self._save()
        if self.parts.pending:  # the store is failing: resume from the saved parts later
            raise ObjectStoreError(f"{len(self.parts.pending)} finished lines are not saved")

    async def _acquire(self, room: asyncio.Semaphore) -> bool:
        """Wait for room in flight; False if the batch was stopped meanwhile."""
        acquire = asyncio.ensure_future(room.acquire())
        stop = asyncio.ensure_future(self.stopped.wait())
        await asyncio.wait({acquire, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if acquire.done() and not acquire.cancelled():
            if self.stopped.is_set():
                room.release()
                return False
            return True
        acquire.cancel()
        return False

    async def _drain(self, running: set[asyncio.Task]) -> None:
        """Wait for in-flight lines; once stopped, only for `cancel_grace` (cancel) or
        not at all (expiry)."""
        while running and not self.stopped.is_set():
            await asyncio.wait(set(running), timeout=0.5)
        if running and self.stop_reason == "cancelled":
            await asyncio.wait(set(running), timeout=self.settings.cancel_grace)

    async def _run(
        self, answer: Awaitable[list[LineOutcome]], room: asyncio.Semaphore, lines: int
    ) -> None:
        """Record the answered lines; their places in flight are free again either way."""
        try:
            for outcome in await answer:
                self._record(outcome)
        finally:
            for _ in range(lines):
                room.release()

    def _packable(self, index: int, raw: bytes | TooLong) -> PackedLine | None:
        if self.pack_inputs <= 1 or self.endpoint.op != "embed":
            return None
        try:
            line = check_line(raw, self.batch.endpoint, self.endpoint, self.gateway.resolve)
        except LineError:
            return None  # answered alone, with the error
        return packed_line(index, line.custom_id, raw, line.body)

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` as the creating key's live request would run (`_as_creator`), again
        after what the queue or the key's token allowance refused, or what timed out
        (429/502/503/504), with backoff, until the batch is stopped."""
        delay = 0.5
        while True:
            try:
                return await self._as_creator(call)
            except ShoalError as exc:
                if exc.status_code not in _RETRYABLE or self.stopped.is_set():
                    raise
                await asyncio.sleep(max(delay, exc.retry_after or 0))
                delay = min(delay * 2, 30.0)

    async def _as_creator(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` checked against the creating key as its live request would be when it
        runs (its route group; its tokens per minute, charged with what it used); the
        model allowlist is checked where the model resolves. Unchecked for a batch made
        without keys."""
        if not self.creator:
            return await call()
        admission = self.runner.admission
        # The key as configured now: a key revoked or narrowed mid-batch stops its lines.
        principal = admission.keys.named(self.creator)
        current_principal.set(principal)
        admission.admit_line(principal, self.group)
        with admission.metered(principal):
            return await call()

    async def _answer_one(self, index: int, raw: bytes | TooLong) -> list[LineOutcome]:
        try:
            line = check_line(raw, self.batch.endpoint, self.endpoint, self.gateway.resolve)
        except LineError as exc:  # valid at validation; the registry (or line cap) changed
            return [LineOutcome(index, custom_id_of(raw), 400, _error_body(exc.message, exc.code))]
        try:
            response = await self._retrying(lambda: self.endpoint.call(self.gateway, line.body))
            return [LineOutcome(index, line.custom_id, 200, _encode(response))]
        except ShoalError as exc:
            body = _encode(exc.to_response())
            return [LineOutcome(index, line.custom_id, exc.status_code, body)]
        except Exception:
            log.exception("batch %s: line %d failed", self.id, index)
            body = _encode(InternalError("Internal server error").to_response())
            return [LineOutcome(index, line.custom_id, 500, body)]

    async def _answer_pack(self, pack: Pack) -> list[LineOutcome]:
        """One request for the whole pack; if it is refused (one line's input is bad, the
        pack is too large for some limit), each line alone, as the live route answers it."""
        if len(pack.lines) > 1:
            try:
                vectors, model = await self._retrying(lambda: pack.embed(self.gateway))
                bodies = pack.answers(vectors, model)
                return [
                    LineOutcome(line.index, line.custom_id, 200, body)
                    for line, body in zip(pack.lines, bodies, strict=True)
                ]
            except ShoalError as exc:
                # A key that may not call the route or use the model may not for any line
                # of the pack (they share both): each fails alike, none runs alone.
                if self.stopped.is_set() or exc.status_code == 403:
                    body = _encode(exc.to_response())
                    status = exc.status_code
                    return [LineOutcome(x.index, x.custom_id, status, body) for x in pack.lines]
                log.info("batch %s: a pack was refused (%s); its lines go alone", self.id, exc)
            except Exception:
                log.exception("batch %s: a pack failed; its lines go alone", self.id)
        alone = await asyncio.gather(*(self._answer_one(x.index, x.raw) for x in pack.lines))
        return [outcome for outcomes in alone for outcome in outcomes]

    async def _count_saved(self) -> None:
        """Reset `done` and the counts to what the saved parts hold."""
        self.done = bytearray(self.counts.total)
        self.counts = RequestCounts(total=self.counts.total)
        async for part in load_parts(self.objects, self.id):
            for outcome in part:
                self._mark(outcome)

    def _mark(self, outcome: LineOutcome) -> bool:
        """Count a finished line once; False if it was already done."""
        if outcome.index >= len(self.done) or self.done[outcome.index]:
            return False
        self.done[outcome.index] = 1
        if outcome.ok:
            self.counts.completed += 1
        else:
            self.counts.failed += 1
        return True

    def _record(self, outcome: LineOutcome) -> None:
        if self._mark(outcome):
            self.parts.add(outcome)

    async def _save_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.settings.flush_seconds)
            await self._save()

    async def _save(self) -> None:
        if not self.parts.pending or not await self.parts.flush():
            return
        counts = msgspec.structs.replace(self.counts)
        await self._update(request_counts=counts)

    # Finalizing ------------------------------------------------------------------------

    async def _finalize(self) -> None:
        final = {"cancelled": "cancelled", "expired": "expired"}.get(self.stop_reason, "completed")
        total = self.counts.total
        if len(self.done) != total:  # stopped before executing: count what parts hold
            await self._count_saved()
        # Otherwise `_execute` left every line it counted saved (it raises if any is
        # still pending), so the counts already match what the output files get, and
        # the parts, as large as the output, are not read a third time.
        if final == "completed":
            missing = total - self.counts.completed - self.counts.failed
            if missing:
                raise RuntimeError(f"{missing} lines are not saved as done")
            await self._update(status="finalizing", finalizing_at=int(time.time()))
        expired_lines = 0
        if final == "expired":
            expired_lines = total - self.counts.completed - self.counts.failed
            self.counts.failed += expired_lines
        output_id = error_id = None
        if self.counts.completed:
            output = await self.files.add(
                f"{self.id}_output.jsonl",
                "batch_output",
                self._output_lines(ok=True, expired=False),
                file_id=f"file-{self.id}-output",
                owner=self.creator,
            )
            output_id = output.id
        if self.counts.failed:
            errors = await self.files.add(
                f"{self.id}_errors.jsonl",
                "batch_output",
                self._output_lines(ok=False, expired=expired_lines > 0),
                file_id=f"file-{self.id}-errors",
                owner=self.creator,
            )
            error_id = errors.id
        now = int(time.time())
        stamps = {"completed": "completed_at", "cancelled": "cancelled_at", "expired": "expired_at"}
        await self._update(
            status=final,
            output_file_id=output_id,
            error_file_id=error_id,
            request_counts=msgspec.structs.replace(self.counts),
            **{stamps[final]: now},
        )
        # The lease is left as it is: a final batch is never claimed again, and releasing
        # it here would make the lease keeper, still running, cancel this cleanup.
        for key in await self.objects.list(part_prefix(self.id)):
            with contextlib.suppress(ObjectStoreError):
                await self.objects.delete(key)
        log.info(
            "batch %s: %s (%d completed, %d failed of %d)",
            self.id,
            final,
            self.counts.completed,
            self.counts.failed,
            total,
        )

    async def _output_lines(self, ok: bool, expired: bool) -> AsyncIterator[bytes]:
        """Saved outcomes with `ok`, each line once; with `expired`, an error line for
        every line that never ran."""
        seen = bytearray(self.counts.total)
        async for part in load_parts(self.objects, self.id):
            for outcome in part:
                if outcome.index < len(seen) and not seen[outcome.index]:
                    seen[outcome.index] = 1
                    if outcome.ok == ok:
                        yield render(self.id, outcome)
        if expired:
            error = _encode(
                {
                    "code": "batch_expired",
                    "message": "This request could not be executed before the completion "
                    "window expired.",
                }
            )
            index = -1
            async for _, raw in self._lines():
                index += 1
                if index < len(seen) and not seen[index]:
                    yield render(self.id, LineOutcome(index, custom_id_of(raw), NO_RESPONSE, error))


def _error_body(message: str, code: str) -> bytes:
    return _encode({"error": {"message": message, "type": "invalid_request_error", "code": code}})


def _empty_file_error() -> BatchError:
    return BatchError(code="empty_file", message="The input file has no requests")


async def _aiter(items) -> AsyncIterator[bytes]:
    for item in items:
        yield item
