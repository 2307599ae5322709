"""One controller per resource."""

from .admin import AdminController
from .chat import ChatController, CompletionsController
from .embeddings import EmbeddingsController
from .health import HealthController
from .models import ModelsController
from .native import NativeController
from .tasks import ClassifyController, MultiVectorController, NerController, RerankController

__all__ = [
    "AdminController",
    "ChatController",
    "ClassifyController",
    "CompletionsController",
    "EmbeddingsController",
    "HealthController",
    "ModelsController",
    "MultiVectorController",
    "NativeController",
    "NerController",
    "RerankController",
]
