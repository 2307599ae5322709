"""The gateway's HTTP/1.1 connections, with the two deadlines uvicorn lacks.

uvicorn times out a connection only while it idles between requests (keep-alive). A
client that opens a connection and sends nothing, or sends a request's head or body a
byte at a time, holds a socket, a file descriptor and a request's memory for as long as
it likes: a few thousand of them fill the process's descriptors and the gateway stops
accepting anyone (a slowloris). So, as Apache's mod_reqtimeout does:

- a request's head must arrive within `head_timeout` of the connection opening or of the
  previous response (none of it: the connection is closed; part of it: 408);
- its body within `body_timeout` of the head, extended by one second for every
  `body_min_rate` bytes that arrive, so a large upload on a slow link still passes
  while a trickle does not (408, in OpenAI's error shape). Time the gateway itself
  spends not reading (its buffer full, the app not yet reading) never counts;
- an answer must be read: a client that leaves it unread for `write_timeout` (its socket
  and the gateway's send buffer full) is cut off, so a stream it does not read ends (and
  its generation with it) instead of waiting for the request's deadline.
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..config import GatewaySettings

__all__ = ["guarded_protocol"]

_TIMEOUT_BODY = json.dumps(
    {
        "error": {
            "message": "the request did not arrive in time",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_timeout",
        }
    }
).encode()
_REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: "
    + str(len(_TIMEOUT_BODY)).encode()
    + b"\r\n\r\n"
    + _TIMEOUT_BODY
)


class _GuardedProtocol(HttpToolsProtocol):
    head_timeout: float
    body_timeout: float
    body_min_rate: float
    write_timeout: float

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_bytes = 0
        self._body_deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._unread: asyncio.TimerHandle | None = None
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        if self._unread is not None:
            self._unread.cancel()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._unread is None:
            self._unread = self.loop.call_later(self.write_timeout, self._left_unread)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._unread is not None:
            self._unread.cancel()
            self._unread = None

    def data_received(self, data: bytes) -> None:
        self._head_bytes += len(data)
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._cancel()
        self._head_bytes = 0
        self._body_deadline = self.loop.time() + self.body_timeout
        super().on_headers_complete()
        self._arm(self._body_deadline, self._body_late)

    def on_body(self, body: bytes) -> None:
        self._body_deadline += len(body) / self.body_min_rate
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._cancel()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._await_head()

    # Deadlines ---------------------------------------------------------------------------

    def _await_head(self) -> None:
        self._head_bytes = 0
        self._arm(self.loop.time() + self.head_timeout, self._head_late)

    def _arm(self, when: float, callback: object) -> None:
        self._cancel()
        self._timer = self.loop.call_at(when, callback)  # type: ignore[arg-type]

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_late(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self._head_bytes:  # a head begun and not finished
            self.transport.write(_REQUEST_TIMEOUT)
        self.transport.close()

    def _left_unread(self) -> None:
        self._unread = None
        if self.flow.write_paused and not self.transport.is_closing():
            # abort, not close: close would wait for a buffer the client never drains. The
            # app then sees the client gone (a stream stops, its request is cancelled).
            self.transport.abort()

    def _body_late(self) -> None:
        self._timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or not cycle.more_body:
            return
        if cycle.response_complete:  # refused before its body: nothing more to wait for
            self.transport.close()
            return
        if cycle.response_started or self.flow.read_paused:
            # Answering already, or the gateway is the one not reading: not the client's
            # delay.
            self._arm(self.loop.time() + self.body_timeout, self._body_late)
            return
        if self.loop.time() < self._body_deadline:  # what arrived since bought more time
            self._arm(self._body_deadline, self._body_late)
            return
        self.transport.write(_REQUEST_TIMEOUT)
        cycle.response_started = cycle.response_complete = True  # the app sends nothing more
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.close()


def guarded_protocol(settings: GatewaySettings) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with `settings`' deadlines."""
    return type(
        "GuardedHttpToolsProtocol",
        (_GuardedProtocol,),
        {
            "head_timeout": settings.head_timeout,
            "body_timeout": settings.body_timeout,
            "body_min_rate": float(settings.body_min_rate),
            "write_timeout": settings.write_timeout,
        },
    )
