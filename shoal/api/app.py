"""The gateway's Litestar application."""

from __future__ import annotations

import asyncio

from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.middleware import DefineMiddleware
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin

from .. import __version__
from ..config import Settings
from .admission import Admission, AdmissionMiddleware
from .errors import exception_handlers
from .observe import ObserveMiddleware, Observer
from .routes import (
    AdminController,
    BatchesController,
    ChatController,
    ClassifyController,
    CompletionsController,
    EmbeddingsController,
    FilesController,
    HealthController,
    ModelsController,
    MultiVectorController,
    NativeController,
    NerController,
    RerankController,
    StatusController,
)
from .runtime import Runtime, runtime_lifespan

__all__ = ["create_app"]


def _provide_runtime(state: State) -> Runtime:
    return state.runtime


def create_app(settings: Settings, stop: asyncio.Event | None = None) -> Litestar:
    """The gateway app; `stop`, once set, ends its start-up wait for NATS."""
    observer = Observer()
    return Litestar(
        route_handlers=[
            ChatController,
            CompletionsController,
            EmbeddingsController,
            ModelsController,
            NerController,
            MultiVectorController,
            RerankController,
            ClassifyController,
            NativeController,
            HealthController,
            AdminController,
            FilesController,
            BatchesController,
            StatusController,
        ],
        dependencies={"runtime": Provide(_provide_runtime, sync_to_thread=False)},
        lifespan=[runtime_lifespan(settings, stop)],
        # Keys, rate limits and the in-flight bound are checked before a body is read.
        # Outermost: requests are timed and counted whatever admission says.
        middleware=[
            DefineMiddleware(ObserveMiddleware, observer=observer),
            DefineMiddleware(AdmissionMiddleware, admission=Admission(settings)),
        ],
        state=State({"observer": observer}),
        exception_handlers=exception_handlers,
        request_max_body_size=settings.gateway.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="Shoal",
            version=__version__,
            path="/docs",
            render_plugins=[SwaggerRenderPlugin()],
        ),
        debug=False,
    )
