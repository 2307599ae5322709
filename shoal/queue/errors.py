"""Why a job could not be answered, as the queue layer reports it to the gateway."""

from __future__ import annotations

from .messages import JobFailed

__all__ = [
    "BacklogTooLongError",
    "DeadlineExceededError",
    "JobFailedError",
    "KeyConflictError",
    "NoWorkerError",
    "PayloadStoreError",
    "QueueError",
    "QueueFullError",
    "QueueUnavailableError",
]


class QueueError(Exception):
    """Base of everything the queue layer raises to its callers."""


class QueueFullError(QueueError):
    """The work stream is at its bound; retry after `retry_after` seconds."""

    def __init__(self, retry_after: float = 1.0) -> None:
        super().__init__("the work queue is full")
        self.retry_after = retry_after


class QueueUnavailableError(QueueError):
    """NATS or the work stream cannot be reached."""

    def __init__(self, detail: str, retry_after: float = 1.0) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class BacklogTooLongError(QueueError):
    """The model's backlog would outlast the request's deadline; retry after
    `retry_after` seconds."""

    def __init__(self, model: str, wait: float, retry_after: float) -> None:
        super().__init__(f"the backlog of {model} would take {wait:.0f}s")
        self.model = model
        self.wait = wait
        self.retry_after = retry_after


class NoWorkerError(QueueError):
    """No live worker serves the model."""

    def __init__(self, model: str, retry_after: float = 5.0) -> None:
        super().__init__(model)
        self.model = model
        self.retry_after = retry_after


class PayloadStoreError(QueueError):
    """A message too large for NATS could not be put in the payload store."""

    def __init__(self, detail: str, retry_after: float = 2.0) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class KeyConflictError(QueueError):
    """A key-value create or compare-and-set lost to a concurrent writer."""


class DeadlineExceededError(QueueError):
    """The request's deadline passed before every part was answered."""


class JobFailedError(QueueError):
    """A worker answered one part with a failure."""

    def __init__(self, failure: JobFailed) -> None:
        super().__init__(failure.message)
        self.failure = failure
