"""The gateway's Litestar application: routes, middleware, error handlers, and the
lifespan that opens the `Gateway` and runs the batch runner beside it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from litestar import Litestar
from litestar.config.cors import CORSConfig
from litestar.datastructures import State
from litestar.di import Provide
from litestar.middleware import DefineMiddleware
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.static_files import create_static_files_router

from .. import __version__
from ..config import Settings
from ..lifecycle import Stopped, unless_stopped
from .admission import Admission, AdmissionMiddleware
from .batches.runner import BatchRunner
from .browser import BrowserGuard, BrowserPolicy
from .errors import exception_handlers
from .gateway import Gateway
from .observe import ObserveMiddleware, Observer
from .routes import (
    TEI_ROUTER,
    WORK_ROUTES,
    AdminController,
    BatchesController,
    FilesController,
    HealthController,
    ModelsController,
    NativeController,
    StatusController,
)
from .status import StatusBoard

__all__ = ["create_app"]

log = logging.getLogger(__name__)


def _provide_gateway(state: State) -> Gateway:
    return state.gateway


def _lifespan(settings: Settings, stop: asyncio.Event | None, admission: Admission):
    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        try:
            gateway = await unless_stopped(Gateway.open(settings), stop or asyncio.Event())
        except Stopped:  # the server exits without serving: there is nothing to close
            log.info("stopped while connecting to NATS")
            yield
            return
        app.state.gateway = gateway
        app.state.status = StatusBoard(gateway, app.state.observer, admission)
        runner = None
        if settings.batches.run_batches:
            runner = BatchRunner(gateway, settings.batches, admission)
        if runner is not None:
            runner.start()
        watcher = asyncio.create_task(admission.watch_keys())
        try:
            yield
        finally:
            watcher.cancel()
            if runner is not None:
                await runner.close()
            await gateway.close()

    return lifespan


def _cors(settings: Settings) -> CORSConfig | None:
    """CORS for the configured origins only (none by default: browsers' cross-origin
    calls are refused, see browser.py)."""
    origins = settings.gateway.cors_origins
    if not origins:
        return None
    return CORSConfig(
        allow_origins=origins,
        allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
        allow_headers=["authorization", "content-type", "openai-organization", "openai-project"],
        expose_headers=["retry-after", "x-request-id", "x-queue-time", "x-inference-time"],
    )


_DOCS_ASSETS = "/docs-assets"


def swagger_ui_assets() -> Path:
    """Swagger UI's files, as the `swagger-ui-py` wheel ships them."""
    import swagger_ui

    return Path(swagger_ui.__file__).parent / "static"


def create_app(settings: Settings, stop: asyncio.Event | None = None) -> Litestar:
    """The gateway app; `stop`, once set, ends its start-up wait for NATS."""
    observer = Observer()
    admission = Admission(settings)
    return Litestar(
        route_handlers=[
            *WORK_ROUTES,
            ModelsController,
            NativeController,
            HealthController,
            AdminController,
            FilesController,
            BatchesController,
            StatusController,
            TEI_ROUTER,
            create_static_files_router(
                _DOCS_ASSETS, [swagger_ui_assets()], include_in_schema=False
            ),
        ],
        dependencies={"gateway": Provide(_provide_gateway, sync_to_thread=False)},
        lifespan=[_lifespan(settings, stop, admission)],
        # The process's own handler (logs.py) stays: Litestar's default config would put
        # its own format and level on the root logger and write through a queue thread,
        # losing what is logged just before a last-resort exit.
        logging_config=None,
        # Browsers' cross-site requests, keys, rate limits and the in-flight bound are
        # checked before a body is read. Outermost: requests are timed and counted
        # whatever the checks say.
        middleware=[
            DefineMiddleware(ObserveMiddleware, observer=observer),
            DefineMiddleware(BrowserGuard, policy=BrowserPolicy(settings)),
            DefineMiddleware(AdmissionMiddleware, admission=admission),
        ],
        cors_config=_cors(settings),
        state=State({"observer": observer, "admission": admission}),
        exception_handlers=exception_handlers,
        request_max_body_size=settings.gateway.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="Shoal",
            version=__version__,
            path="/docs",
            # Served from the gateway itself, not a CDN: /docs works offline and on an
            # air-gapped cluster.
            render_plugins=[
                SwaggerRenderPlugin(
                    js_url=f"{_DOCS_ASSETS}/swagger-ui-bundle.js",
                    css_url=f"{_DOCS_ASSETS}/swagger-ui.css",
                    standalone_preset_js_url=f"{_DOCS_ASSETS}/swagger-ui-standalone-preset.js",
                    favicon=f'<link rel="icon" href="{_DOCS_ASSETS}/favicon-32x32.png">',
                )
            ],
        ),
        debug=False,
    )
