"""The encoder worker kind: embeddings, NER, multi-vector, rerank, classify and sparse
jobs, batched by token cost (`worker.py`), scheduled by a pure policy (`schedule.py`)."""
