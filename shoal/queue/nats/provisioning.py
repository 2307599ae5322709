"""Retrying JetStream's admin requests while a cluster is still settling."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors

from ...lifecycle import retry_until_ready

__all__ = ["provisioning"]

_T = TypeVar("_T")

_NOT_READY = (
    nats.errors.TimeoutError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NotFoundError,
)
"""What a JetStream cluster answers while it elects leaders or is busy creating streams:
a timeout, "unavailable", and "not found" for a stream another process is creating at
that moment (nats-server #4600; a gateway of `shoal serve --nats-nodes 3` died of it in
CI). Provisioning makes every stream before what lives in it, so a stream still not
found when the bound runs out is an error then."""


async def provisioning(what: str, call: Callable[[], Awaitable[_T]], within: float) -> _T:
    """`call()`, retried while JetStream is not answering in time or not showing yet a
    stream that provisioning made.

    A cluster that is still electing leaders, or that several processes ask at once to
    create replicated streams (`shoal serve --nats-nodes 3` on two cores), can time out
    an admin request it then completes. Every call here is idempotent, so retry it.
    """
    return await retry_until_ready(
        call, what=what, retry_on=_NOT_READY, within=within, first_delay=0.5
    )
