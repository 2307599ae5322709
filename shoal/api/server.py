"""`shoal gateway`: the app under uvicorn (uvloop + httptools)."""

from __future__ import annotations

import signal
from types import FrameType

import uvicorn

from .. import telemetry
from ..config import Settings
from ..lifecycle import DRAIN_SECONDS, StopSignals
from .app import create_app
from .connections import guarded_protocol

__all__ = ["run_gateway"]


class _Server(uvicorn.Server):
    """uvicorn, whose signal handling also tells the app (a stop while the lifespan is
    still connecting to NATS ends that wait) and arms the last-resort exit."""

    def __init__(self, config: uvicorn.Config, signals: StopSignals) -> None:
        super().__init__(config)
        self.signals = signals

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self.signals.trip(sig)


def run_gateway(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM: requests in flight get `DRAIN_SECONDS` to finish."""
    g = settings.gateway
    telemetry.setup("gateway", settings.telemetry)
    signals = StopSignals()
    config = uvicorn.Config(
        create_app(settings, stop=signals.event),
        host=g.host,
        port=g.port,
        loop="uvloop",
        http=guarded_protocol(g),  # httptools, with head and body deadlines
        log_level=settings.log_level.lower() if settings.log_level != "info" else "warning",
        access_log=False,
        log_config=None,  # uvicorn's records go through the process's handler (JSON lines)
        timeout_graceful_shutdown=DRAIN_SECONDS,
    )
    # uvicorn raises the signal it handled again once it has shut down, with the handler
    # it found: it was handled, so that one does nothing (the exit status stays 0).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    _Server(config, signals).run()
    telemetry.shutdown()
