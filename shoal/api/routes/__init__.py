"""One controller per resource."""

from .admin import AdminController
from .batches import BatchesController
from .chat import ChatController, CompletionsController
from .embeddings import EmbeddingsController
from .files import FilesController
from .health import HealthController
from .models import ModelsController
from .native import NativeController
from .status import StatusController
from .tasks import ClassifyController, MultiVectorController, NerController, RerankController

__all__ = [
    "AdminController",
    "BatchesController",
    "ChatController",
    "ClassifyController",
    "CompletionsController",
    "EmbeddingsController",
    "FilesController",
    "HealthController",
    "ModelsController",
    "MultiVectorController",
    "NativeController",
    "NerController",
    "RerankController",
    "StatusController",
]
