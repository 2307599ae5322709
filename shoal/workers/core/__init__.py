"""The worker core: delivery for every kind of worker (see worker.py and kind.py)."""

from .held import Held
from .kind import Core, WorkerKind
from .outcomes import SETTLE, Outcome, Settlement
from .served import Served
from .worker import Worker

__all__ = ["SETTLE", "Core", "Held", "Outcome", "Served", "Settlement", "Worker", "WorkerKind"]
