"""`shoal gateway`: the app under uvicorn (uvloop + httptools)."""

from __future__ import annotations

import uvicorn

from .. import telemetry
from ..config import Settings
from .app import create_app

__all__ = ["run_gateway"]


def run_gateway(settings: Settings) -> None:
    g = settings.gateway
    telemetry.setup("gateway", settings.telemetry)
    uvicorn.run(
        create_app(settings),
        host=g.host,
        port=g.port,
        loop="uvloop",
        http="httptools",
        log_level=settings.log_level.lower() if settings.log_level != "info" else "warning",
        access_log=False,
        log_config=None,  # uvicorn's records go through the process's handler (JSON lines)
        timeout_graceful_shutdown=10,
    )
    telemetry.shutdown()
