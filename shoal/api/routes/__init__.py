"""One controller per resource."""

from .admin import AdminController
from .batches import BatchesController
from .chat import ChatController, CompletionsController, ResponsesController
from .embeddings import EmbeddingsController
from .files import FilesController
from .health import HealthController
from .models import ModelsController
from .native import NativeController
from .status import StatusController
from .tasks import (
    ClassifyController,
    CohereRerankController,
    MultiVectorController,
    NerController,
    RerankController,
    ScoreController,
    SparseController,
)

__all__ = [
    "AdminController",
    "BatchesController",
    "ChatController",
    "ClassifyController",
    "CohereRerankController",
    "CompletionsController",
    "EmbeddingsController",
    "FilesController",
    "HealthController",
    "ModelsController",
    "MultiVectorController",
    "NativeController",
    "NerController",
    "RerankController",
    "ResponsesController",
    "ScoreController",
    "SparseController",
    "StatusController",
]
