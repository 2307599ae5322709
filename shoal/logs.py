"""Process logging: one JSON object per line for collectors, readable lines for people.

JSON when stderr is not a terminal (a container, a log file), text when it is. Each
record carries the request id and trace id of the request it was logged for, when there
is one. What gets logged is the caller's business: no secrets, and no request bodies at
info level (keys are named by their configured name, never their value).
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from typing import Any

import msgspec

from . import telemetry

__all__ = ["JsonFormatter", "configure_logging", "current_request_id"]

current_request_id: contextvars.ContextVar[str] = contextvars.ContextVar(
    "shoal_request_id", default=""
)
"""The id of the request being handled (the gateway sets it once a request is resolved)."""

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_encode = msgspec.json.Encoder().encode


class JsonFormatter(logging.Formatter):
    """One JSON object per log record, for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = current_request_id.get()
        if request_id:
            entry["request_id"] = request_id
        trace_id = telemetry.trace_id()
        if trace_id:
            entry["trace_id"] = trace_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return _encode(entry).decode()


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = current_request_id.get()
        return f"{line} [request {request_id}]" if request_id else line


def configure_logging(level: str) -> None:
    """Send this process's logs to stderr, as JSON lines unless it is a terminal."""
    handler = logging.StreamHandler(sys.stderr)
    tty = sys.stderr.isatty()
    handler.setFormatter(_TextFormatter(_TEXT_FORMAT) if tty else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
