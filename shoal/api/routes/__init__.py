"""The gateway's routes: those that run work, one per row of the route table
(work.py), and a controller per other resource."""

from .admin import AdminController
from .batches import BatchesController
from .files import FilesController
from .health import HealthController
from .models import ModelsController
from .native import NativeController
from .status import StatusController
from .tei import TEI_ROUTER
from .work import WORK_ROUTES

__all__ = [
    "TEI_ROUTER",
    "WORK_ROUTES",
    "AdminController",
    "BatchesController",
    "FilesController",
    "HealthController",
    "ModelsController",
    "NativeController",
    "StatusController",
]
