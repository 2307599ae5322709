"""The admin API's worker view shows every field of a worker's heartbeat."""

from __future__ import annotations

import msgspec

from shoal.compat.admin import WorkerInfo
from shoal.queue.heartbeat import WorkerHeartbeat


def test_worker_info_carries_every_heartbeat_field() -> None:
    # A field added to the heartbeat alone made /admin/v1/status answer 500 once.
    info = {f.name for f in msgspec.structs.fields(WorkerInfo)}
    beat = {f.name for f in msgspec.structs.fields(WorkerHeartbeat)}
    assert info == beat
    heartbeat = WorkerHeartbeat(worker_id="w", models=["*"], state="ready", sent_at=1.0)
    assert WorkerInfo.of(heartbeat).worker_id == "w"
