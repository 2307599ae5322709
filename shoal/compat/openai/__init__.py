"""OpenAI wire schemas (msgspec Structs), one module per endpoint family."""

from .embeddings import Embedding, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage
from .models import Model, ModelList

__all__ = [
    "Embedding",
    "EmbeddingRequest",
    "EmbeddingResponse",
    "EmbeddingUsage",
    "Model",
    "ModelList",
]
