"""JetStream work queue: subjects, wire messages, provisioning, publish and pull.

`nats/` is the only package that imports nats-py; everything above it uses `Bus`,
`Dispatcher` (gateway side) and the `WorkSource`/`Delivery` protocols (worker side).
"""

from .dispatcher import Dispatcher
from .embedded import EmbeddedNats, EmbeddedNatsCluster, ServerAuth, free_port, nats_server_binary
from .errors import (
    DeadlineExceededError,
    JobFailedError,
    KeyConflictError,
    NoWorkerError,
    QueueError,
    QueueFullError,
    QueueUnavailableError,
)
from .heartbeat import WorkerHeartbeat
from .messages import (
    EmbedJob,
    EmbedResult,
    FailureCode,
    GenerateChunk,
    GenerateJob,
    Job,
    JobFailed,
    Reply,
)
from .nats import Bus
from .provision import ensure_consumer, ensure_work_stream
from .source import Delivery, WorkSource
from .subjects import Lane, Subjects

__all__ = [
    "Bus",
    "DeadlineExceededError",
    "Delivery",
    "Dispatcher",
    "EmbedJob",
    "EmbedResult",
    "EmbeddedNats",
    "EmbeddedNatsCluster",
    "FailureCode",
    "GenerateChunk",
    "GenerateJob",
    "Job",
    "JobFailed",
    "JobFailedError",
    "KeyConflictError",
    "Lane",
    "NoWorkerError",
    "QueueError",
    "QueueFullError",
    "QueueUnavailableError",
    "Reply",
    "ServerAuth",
    "Subjects",
    "WorkSource",
    "WorkerHeartbeat",
    "ensure_consumer",
    "ensure_work_stream",
    "free_port",
    "nats_server_binary",
]
