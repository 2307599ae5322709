"""One controller per resource."""

from .embeddings import EmbeddingsController
from .health import HealthController
from .models import ModelsController
from .native import NativeController

__all__ = ["EmbeddingsController", "HealthController", "ModelsController", "NativeController"]
