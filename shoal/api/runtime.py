"""Everything a request handler needs, opened once per gateway process.

The NATS connection, the dispatcher (publish jobs, gather replies) and the model
registry live in one `Runtime`, opened by the app's lifespan and handed to handlers as a
typed dependency.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, TypeVar

import msgspec
from litestar import Litestar
from litestar.params import Dependency

from ..compat.embed import EmbedOptions, Vectors, build_embed_jobs, join_vectors
from ..compat.errors import (
    GatewayTimeoutError,
    InternalError,
    InvalidRequestError,
    ModelNotFoundError,
    NotFoundError,
    OverloadedError,
    ShoalError,
    UnavailableError,
)
from ..compat.extensions import ShoalOptions
from ..compat.jobs import Envelope
from ..config import Settings
from ..lifecycle import Stopped, unless_stopped
from ..model_registry import (
    LiveRegistry,
    ModelRegistry,
    ModelSpec,
    SourceResolver,
    UnknownAdapterError,
    UnknownModelError,
)
from ..queue import (
    Bus,
    DeadlineExceededError,
    Dispatcher,
    ErrorKind,
    Job,
    JobFailedError,
    Lane,
    NoWorkerError,
    QueueFullError,
    QueueUnavailableError,
    Subjects,
)
from ..queue.dead_letters import DeadLetters
from ..queue.errors import BacklogTooLongError, PayloadStoreError
from ..queue.messages import Result
from ..queue.objects import open_object_store
from ..queue.payloads import PayloadStore
from .admission import current_principal, meter_usage
from .batches.store import BatchStore
from .files import FileStore
from .keys import PermissionDeniedError
from .observe import note_request

__all__ = ["Runtime", "RuntimeDep", "Target", "runtime_lifespan"]

log = logging.getLogger(__name__)

J = TypeVar("J")


class Target(msgspec.Struct, frozen=True):
    """What a request runs on: a model and, optionally, one of its LoRA adapters."""

    spec: ModelSpec
    adapter: str = ""

    @property
    def name(self) -> str:
        """The model's name in responses: `base` or `base:adapter`."""
        return f"{self.spec.id}:{self.adapter}" if self.adapter else self.spec.id


class Runtime:
    def __init__(
        self,
        settings: Settings,
        registry: LiveRegistry,
        bus: Bus,
        files: FileStore,
        batches: BatchStore,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.bus = bus
        self.files = files
        self.batches = batches
        subjects = Subjects(settings.nats.subject_prefix)
        payloads = PayloadStore(files.objects, settings.nats.offload_bytes, bus.max_payload)
        self.dispatcher = Dispatcher(bus, subjects, settings.gateway, settings.nats, payloads)
        self.dead_letters = DeadLetters(bus, settings.nats, subjects)
        self.sources = SourceResolver(Path(settings.data_dir) / "cache", settings.s3)
        self.started_at = int(time.time())
        self.lane: Lane = "interactive"
        """Where this runtime's work goes; batch runs use a view on the batch lane."""
        self.request_timeout = settings.gateway.request_timeout

    def on_batch_lane(self, timeout: float) -> Runtime:
        """A view sharing everything but where work goes (the low-priority batch lane,
        which workers serve only with spare capacity) and how long a request may take."""
        view = copy.copy(self)
        view.lane = "batch"
        view.request_timeout = timeout
        return view

    @classmethod
    async def open(cls, settings: Settings) -> Runtime:
        """Connect to NATS (waiting for it for `nats.ready_within` seconds), provision the
        stream and load the registry (spec files, then run-time registrations)."""
        static = ModelRegistry.from_files(settings.models_file)
        bus = await Bus.open(settings.nats, name="shoal-gateway")
        registry = LiveRegistry(static, await bus.key_value(settings.nats.registry_bucket))
        await registry.start()
        objects = open_object_store(settings.objects, settings.s3, settings.data_dir)
        files = FileStore(await bus.key_value(settings.nats.files_bucket), objects)
        batches = BatchStore(await bus.key_value(settings.nats.batches_bucket))
        runtime = cls(settings, registry, bus, files, batches)
        await runtime.dispatcher.start()
        await runtime.dead_letters.watch_exhausted()
        return runtime

    async def close(self) -> None:
        await self.dead_letters.close()
        await self.dispatcher.close()
        await self.bus.close()

    def resolve(
        self, name: str, op: str | None = "embed", shoal: ShoalOptions | None = None
    ) -> Target:
        """What `name` (`model` or `model:adapter`, or an adapter in the `shoal` extension)
        runs on; the model must serve `op` (None: any).

        Raises:
            ModelNotFoundError: no such model.
            NotFoundError: no such adapter of that model.
            InvalidRequestError: the model does not serve `op` (the message names what it
                serves), or two different adapters were named.
            PermissionDeniedError: the caller's API key may not use the model.
        """
        base, _, adapter = name.partition(":")
        try:
            spec = self.registry.resolve(base)
        except UnknownModelError:
            raise ModelNotFoundError(name) from None
        principal = current_principal.get()
        if principal is not None and not principal.may_use(name, base, spec.id, *spec.aliases):
            raise PermissionDeniedError(
                f"The API key '{principal.name}' may not use model '{name}'",
                param="model",
                code="model_not_allowed",
            )
        if shoal is not None and shoal.adapter:
            if adapter and adapter != shoal.adapter:
                raise InvalidRequestError(
                    f"the model string names adapter '{adapter}' and 'shoal.adapter' names "
                    f"'{shoal.adapter}'",
                    param="shoal.adapter",
                )
            adapter = shoal.adapter
        if op is not None and op not in spec.tasks:
            raise InvalidRequestError(
                f"model '{spec.id}' does not serve {op}; it serves {', '.join(spec.tasks)}",
                param="model",
                code="unsupported_task",
            )
        if adapter:
            try:
                self.registry.resolve_adapter(spec.id, adapter)
            except UnknownAdapterError:
                owners = [a.base for a in self.registry.adapters() if a.name == adapter]
                if owners:
                    raise InvalidRequestError(
                        f"adapter '{adapter}' belongs to model '{owners[0]}', not '{spec.id}'",
                        param="model",
                        code="adapter_base_mismatch",
                    ) from None
                raise NotFoundError(
                    f"model '{spec.id}' has no adapter '{adapter}'",
                    param="model",
                    code="adapter_not_found",
                ) from None
        return Target(spec, adapter)

    def prepare(self, target: Target, build: Callable[[Envelope], list[J]]) -> list[J]:
        """A request's jobs, built for a new request id, this gateway's inbox and the
        request deadline."""
        dispatcher = self.dispatcher
        deadline = time.time() + self.request_timeout
        request_id = dispatcher.new_request_id()
        note_request(target.spec.id, request_id)
        env = Envelope(
            request_id, target.spec.id, dispatcher.reply_subject, deadline, target.adapter
        )
        return build(env)

    async def run(self, target: Target, build: Callable[[Envelope], list[Job]]) -> list[Result]:
        """Build a request's jobs and run them through the queue; queue and worker
        failures become ShoalErrors."""
        jobs = self.prepare(target, build)
        try:
            results = await self.dispatcher.submit(
                jobs[0].request_id, jobs, self.lane, jobs[0].deadline
            )
        except Exception as exc:
            raise as_shoal_error(exc, target.name) from exc
        meter_usage(sum(r.prompt_tokens for r in results))
        return results

    async def embed(
        self,
        target: Target,
        options: EmbedOptions,
        texts: Sequence[str] = (),
        token_ids: Sequence[list[int]] = (),
    ) -> Vectors:
        """Embed inputs through the queue."""
        limits = self.settings.gateway
        spec = target.spec
        results = await self.run(
            target,
            lambda env: build_embed_jobs(env, spec, options, limits, texts, token_ids),
        )
        return join_vectors(results)  # type: ignore[arg-type]


RuntimeDep = Annotated[Runtime, Dependency(skip_validation=True)]
"""How handlers declare the runtime: injected, never validated."""


_KIND_ERRORS: dict[ErrorKind, type[ShoalError]] = {
    ErrorKind.INVALID_INPUT: InvalidRequestError,
    ErrorKind.DEADLINE_EXCEEDED: GatewayTimeoutError,
    ErrorKind.NOT_FOUND: NotFoundError,
    ErrorKind.UNAVAILABLE: UnavailableError,
    ErrorKind.INTERNAL: InternalError,
}


def as_shoal_error(exc: Exception, model: str) -> Exception:
    """The one table from queue-layer failures to HTTP errors."""
    match exc:
        case JobFailedError(failure=failure):
            return _KIND_ERRORS[failure.kind](failure.message, param=failure.param or None)
        case QueueFullError():
            return OverloadedError(
                "The work queue is full; retry after a moment", retry_after=exc.retry_after
            )
        case BacklogTooLongError():
            return UnavailableError(
                f"Model '{model}' has a backlog its workers would not finish before this "
                "request's deadline; retry after a moment",
                code="backlog_too_long",
                retry_after=exc.retry_after,
            )
        case NoWorkerError():
            return UnavailableError(
                f"No worker is serving model '{model}' right now",
                code="no_worker",
                retry_after=exc.retry_after,
            )
        case PayloadStoreError():
            log.warning("payload store: %s", exc)
            return UnavailableError(
                "The request is too large for one queue message and the payload store "
                "is unreachable; retry after a moment",
                code="payload_store_unavailable",
                retry_after=exc.retry_after,
            )
        case QueueUnavailableError():
            log.warning("queue unavailable: %s", exc)
            return UnavailableError(
                "The work queue is unreachable; retry after a moment",
                retry_after=exc.retry_after,
            )
        case DeadlineExceededError():
            return GatewayTimeoutError("The request was not answered before its deadline")
        case _:
            return exc


def runtime_lifespan(settings: Settings, stop: asyncio.Event | None = None):
    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        from .batches.runner import BatchRunner
        from .status import StatusBoard

        try:
            runtime = await unless_stopped(Runtime.open(settings), stop or asyncio.Event())
        except Stopped:  # the server exits without serving: there is nothing to close
            log.info("stopped while connecting to NATS")
            yield
            return
        app.state.runtime = runtime
        app.state.status = StatusBoard(runtime, app.state.observer)
        runner = BatchRunner(runtime, settings.batches) if settings.batches.run_batches else None
        if runner is not None:
            runner.start()
        try:
            yield
        finally:
            if runner is not None:
                await runner.close()
            await runtime.close()

    return lifespan
