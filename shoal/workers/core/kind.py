"""What a kind of worker plugs into the worker core.

The core (worker.py) owns delivery: it pulls each served model's interactive and batch
lanes, reads and admits jobs, keeps them alive, cancels them, settles them and stops
cleanly. A kind owns what differs: which models it serves, how admitted jobs become
batches or slots, the runtime call, and what it adds to heartbeats. Encoders
(`shoal.workers.encoder.worker`) and generation (`shoal.workers.generation.worker`) are
the two kinds today; a new one (a sparse encoder, a new generation runtime) is a module
that implements this.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, Protocol

from ...model_registry import LiveRegistry, ModelSpec
from ...queue.messages import Job, Reply
from ...queue.source import Delivery
from .held import Held
from .outcomes import Outcome

__all__ = ["Core", "WorkerKind"]


class Core(Protocol):
    """What a kind may use of the worker core that runs it (worker.py's `Worker`): named
    here so that the kind needs no import of the core, which imports the kind."""

    registry: LiveRegistry
    held: dict[int, Held]
    """The jobs held, by id()."""

    @property
    def models(self) -> Mapping[str, object]:
        """The models served, by id."""
        ...

    async def publish(self, held: Held, message: bytes) -> bool: ...

    async def answer(self, held: Held, result: Reply) -> bool: ...

    async def settle(
        self, held: Held, outcome: Outcome, message: str = "", param: str | None = None
    ) -> None: ...

    def release(self, held: Held) -> None: ...

    def signal_room(self) -> None: ...


class WorkerKind(ABC):
    """A kind of worker, as the core runs it (see the module doc)."""

    name: str = "worker"
    """Names the kind in worker ids (`<name>-<hex>`) and logs."""

    core: Core

    def attach(self, core: Core) -> None:
        """Called once by the core that runs this kind."""
        self.core = core

    @abstractmethod
    def serves(self, spec: ModelSpec) -> bool:
        """Whether this worker serves `spec` (the settings' model list and the tasks)."""

    @abstractmethod
    async def add_model(self, spec: ModelSpec) -> None:
        """Serve `spec` (set it up; load it now or on its first job)."""

    async def update_model(self, old: ModelSpec, new: ModelSpec) -> bool:
        """A served model's spec changed: apply it live and return True, or return False
        and the core serves it anew (`remove_model`, then `add_model`)."""
        return False

    async def registry_changed(self) -> None:  # noqa: B027 (an optional hook)
        """The registry changed (after the core reconciled its models): e.g. drop the
        LoRA adapters no longer registered."""

    @abstractmethod
    async def remove_model(self, model: str) -> None:
        """Stop serving `model` (its held jobs were returned to the queue already)."""

    @abstractmethod
    def room(self, model: str, batch_lane: bool) -> int:
        """How many items to pull for `model`'s lane now (0: none until there is room)."""

    def hold(self, delivery: Delivery, job: Job, batch_lane: bool) -> Held:
        """The holder of an admitted job (a kind may keep more per job)."""
        return Held(delivery, job, batch_lane)

    @abstractmethod
    async def accept(self, model: str, jobs: list[Held], batch_lane: bool) -> None:
        """Schedule admitted jobs (not cancelled, not expired) for `model`; settle each
        one through the core when it ends."""

    def drop(self, jobs: list[Held]) -> None:  # noqa: B027 (an optional hook)
        """These held jobs were settled by the core (their request was cancelled): stop
        what runs for them and drop what is queued."""

    def can_finish(self) -> bool:
        """While stopping: whether held work can still finish (a model is resident)."""
        return True

    async def start(self) -> None:  # noqa: B027 (an optional hook)
        """Start background work (a scheduler) once the models are added."""

    async def stop(self) -> None:  # noqa: B027 (an optional hook)
        """Stop background work and runtimes (held jobs were returned already)."""

    def heartbeat(self) -> dict[str, Any]:
        """Extra `WorkerHeartbeat` fields (what is resident, throughput)."""
        return {}

    def ready_models(self) -> list[str]:
        """What the start-up log line lists."""
        return sorted(self.core.models)
