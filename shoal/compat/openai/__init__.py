"""OpenAI wire schemas (msgspec Structs), one module per endpoint family."""

from .embeddings import Embedding, EmbeddingRequest, EmbeddingResponse
from .models import Model, ModelList

__all__ = [
    "Embedding",
    "EmbeddingRequest",
    "EmbeddingResponse",
    "Model",
    "ModelList",
]
