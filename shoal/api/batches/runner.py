"""The batch runner: works through batches on the low-priority lane, resumably.

Every gateway runs one (unless `batches.run_batches` is off); runners share the work by
leases on the batch records (api/batch_store.py). For each batch it holds, a runner:

1. validates the whole input file (status `validating`) before anything is queued, and
   fails the batch with every bad line named if any is wrong;
2. sends lines through the same code the live routes use, on the batch lane and at most
   `max_in_flight` at a time (flow control), retrying what the queue refuses or times out
   (429/502/503/504) with backoff until the batch expires;
3. saves finished lines every `flush_seconds` as a part in the object store (parts.py)
   and the counts in the record;
4. finalizes: joins the parts into the output and error files, each line exactly once.

A restarted or second runner that claims the batch reads the saved parts and sends only
the lines not yet done, so killing a gateway or a worker mid-batch loses nothing and
answers nothing twice (at most the unsaved last second of lines is computed again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from typing import TYPE_CHECKING

from ...compat.errors import ShoalError
from ...config import BatchSettings
from ..batch_store import BatchStore
from .run import BatchRun

if TYPE_CHECKING:
    from ..admission import Admission
    from ..gateway import Gateway

__all__ = ["BatchRunner", "completion_window_seconds"]

log = logging.getLogger(__name__)

_WINDOW = re.compile(r"^(\d+)([hms])$")


def completion_window_seconds(window: str) -> int | None:
    """`24h` (OpenAI's only value) and, as a Shoal extension, any `<n>h|m|s`."""
    match = _WINDOW.match(window)
    if not match or int(match.group(1)) == 0:
        return None
    return int(match.group(1)) * {"h": 3600, "m": 60, "s": 1}[match.group(2)]


class BatchRunner:
    """Claims unfinished batches by lease and runs each (run.py) on the batch lane; every
    gateway runs one."""

    def __init__(
        self, gateway: Gateway, settings: BatchSettings, admission: Admission, poll: float = 0.5
    ) -> None:
        self.gateway = gateway
        self.settings = settings
        self.store: BatchStore = gateway.batches
        self.runner_id = secrets.token_hex(6)
        self._poll = poll
        self._runs: dict[str, asyncio.Task] = {}
        self._finished: set[str] = set()
        self._task: asyncio.Task | None = None
        self.admission = admission
        """The gateway's keys and rate limits: lines are checked as live requests are."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        """Stop working; held batches are left to lease expiry and another runner."""
        tasks = [t for t in (self._task, *self._runs.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            try:
                await self._claim()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS reconnecting: try again at the next poll
                log.warning("batch runner %s: claiming failed: %r", self.runner_id, exc)
            await asyncio.sleep(self._poll)

    async def _claim(self) -> None:
        for batch_id in await self.store.ids():
            if len(self._runs) >= self.settings.max_batches_running:
                return
            if batch_id in self._finished or batch_id in self._runs:
                continue
            record = await self.store.claim(batch_id, self.runner_id, self.settings.lease_seconds)
            if record is None:
                with contextlib.suppress(ShoalError):
                    if (await self.store.get(batch_id)).final:
                        self._finished.add(batch_id)
                continue
            log.info("batch %s: claimed by runner %s", batch_id, self.runner_id)
            task = asyncio.create_task(BatchRun(self, record).run())
            self._runs[batch_id] = task
            task.add_done_callback(lambda _, b=batch_id: self._runs.pop(b, None))
