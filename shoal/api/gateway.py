"""Everything a request handler needs, opened once per gateway process.

The NATS connection, the dispatcher (publish jobs, gather replies), the model registry
and the file and batch stores live in one `Gateway`, opened by the app's lifespan and
handed to handlers as a typed dependency.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from typing import Annotated, Protocol

import msgspec
from litestar.params import Dependency

from ..compat.errors import (
    InvalidRequestError,
    ModelNotFoundError,
    NotFoundError,
)
from ..compat.extensions import ShoalOptions
from ..compat.jobs import Envelope
from ..config import GatewaySettings, Settings
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
    Dispatcher,
    Job,
    Lane,
    Subjects,
)
from ..queue.dead_letters import DeadLetters
from ..queue.messages import Result
from ..queue.objects import open_object_store
from ..queue.payloads import PayloadStore
from .admission import caller_may_use, current_principal, meter_usage
from .batch_store import BatchStore
from .calibration import Calibrations
from .errors import as_shoal_error
from .files import FileStore
from .keys import PermissionDeniedError
from .observe import note_request

__all__ = ["Gateway", "GatewayDep", "JobsRequest", "Target"]

log = logging.getLogger(__name__)


class JobsRequest(Protocol):
    """A request the gateway can turn into jobs: every encoder and generation request."""

    def to_jobs(self, env: Envelope, spec: ModelSpec, limits: GatewaySettings) -> Sequence[Job]: ...


class Target(msgspec.Struct, frozen=True):
    """What a request runs on: a model and, optionally, one of its LoRA adapters."""

    spec: ModelSpec
    adapter: str = ""

    @property
    def name(self) -> str:
        """The model's name in responses: `base` or `base:adapter`."""
        return f"{self.spec.id}:{self.adapter}" if self.adapter else self.spec.id


class Gateway:
    """A gateway process's connections and stores, and the two steps every request takes:
    `resolve` a model name, `run` its jobs through the queue."""

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
        payloads = PayloadStore.on(files.objects, settings, bus)
        self.dispatcher = Dispatcher(bus, subjects, settings.gateway, settings.nats, payloads)
        self.dead_letters = DeadLetters(bus, settings.nats, subjects)
        self.sources = SourceResolver.of(settings)
        self.started_at = int(time.time())
        self.lane: Lane = "interactive"
        """Where this gateway's work goes; batch runs use a view on the batch lane."""
        self.request_timeout = settings.gateway.request_timeout
        self.calibrations = Calibrations()
        """Embedding models' int8/uint8 ranges (shared with the batch-lane view)."""

    def on_batch_lane(self, timeout: float) -> Gateway:
        """A view sharing everything but where work goes (the low-priority batch lane,
        which workers serve only with spare capacity) and how long a request may take."""
        view = copy.copy(self)
        view.lane = "batch"
        view.request_timeout = timeout
        return view

    @classmethod
    async def open(cls, settings: Settings) -> Gateway:
        """Connect to NATS (waiting for it for `nats.ready_within` seconds), provision the
        stream and load the registry (spec files, then run-time registrations)."""
        static = ModelRegistry.from_files(*settings.spec_files)
        bus = await Bus.open(settings.nats, name="shoal-gateway")
        registry = LiveRegistry(static, await bus.key_value(settings.nats.registry_bucket))
        await registry.start()
        objects = open_object_store(settings.objects, settings.s3, settings.data_dir)
        files = FileStore(
            await bus.key_value(settings.nats.files_bucket),
            objects,
            settings.batches.quota_bytes_per_key,
            settings.batches.quota_bytes_total,
        )
        batches = BatchStore(await bus.key_value(settings.nats.batches_bucket))
        gateway = cls(settings, registry, bus, files, batches)
        await gateway.dispatcher.start()
        await gateway.dead_letters.watch_exhausted()
        return gateway

    async def close(self) -> None:
        await self.dead_letters.close()
        await self.dispatcher.close()
        await self.bus.close()

    def _could_name(self, op: str | None) -> list[str]:
        """The models serving `op` that the caller's key may use: what an unknown model's
        error suggests (never a model the key may not see)."""
        return sorted(
            spec.id
            for spec in self.registry
            if (op is None or op in spec.tasks) and caller_may_use(spec.id, *spec.aliases)
        )

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
            raise ModelNotFoundError(name, self._could_name(op)) from None
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
        if op is not None and not spec.serves(op):
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

    def prepare(self, target: Target, request: JobsRequest) -> list[Job]:
        """`request`'s jobs for `target`, built for a new request id, this gateway's
        inbox and the request deadline."""
        dispatcher = self.dispatcher
        deadline = time.time() + self.request_timeout
        request_id = dispatcher.new_request_id()
        note_request(target.spec.id, request_id)
        env = Envelope(
            request_id, target.spec.id, dispatcher.reply_subject, deadline, target.adapter
        )
        return list(request.to_jobs(env, target.spec, self.settings.gateway))

    async def run(self, target: Target, request: JobsRequest) -> list[Result]:
        """Build `request`'s jobs for `target` and run them through the queue; queue and
        worker failures become ShoalErrors."""
        jobs = self.prepare(target, request)
        try:
            results = await self.dispatcher.submit(
                jobs[0].request_id, jobs, self.lane, jobs[0].deadline
            )
        except Exception as exc:
            raise as_shoal_error(exc, target.name) from exc
        meter_usage(sum(r.prompt_tokens for r in results))
        return results


GatewayDep = Annotated[Gateway, Dependency(skip_validation=True)]
"""How handlers declare the gateway: injected, never validated."""
