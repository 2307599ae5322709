"""A top-down push router, the vLLM / SGLang router's kind, for the scale validation.

It sits in front of the gateway like those routers sit in front of their engines: for
each request it picks one worker and sends the request to that worker's own queue. Here
each worker serves a model of its own (`sleep-w0`, `sleep-w1`, ...: one JetStream
consumer each, so a worker's queue is its alone), and the router rewrites the request's
`model` to the chosen worker's. It counts the requests it sent to each worker that are not
answered yet, as those routers do, and picks by `--policy`:

- `round-robin`: each worker in turn;
- `least-outstanding`: the worker with the fewest unanswered requests;
- `power-of-two`: the less loaded of two drawn at random.

    python -m perf.scale.router --port P --gateway URL --workers N --policy NAME
"""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

import httpx
import uvicorn

POLICIES = ("round-robin", "least-outstanding", "power-of-two")


class PushRouter:
    """An ASGI app forwarding `POST /v1/embeddings` to one worker's model."""

    def __init__(self, gateway: str, workers: int, policy: str) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        self.gateway = gateway
        self.policy = policy
        self.outstanding = [0] * workers
        self.turn = 0
        self.client: httpx.AsyncClient | None = None
        self.rng = random.Random(0)

    def pick(self) -> int:
        n = len(self.outstanding)
        if self.policy == "round-robin":
            self.turn = (self.turn + 1) % n
            return self.turn
        if self.policy == "least-outstanding":
            least = min(self.outstanding)
            return self.rng.choice([i for i, o in enumerate(self.outstanding) if o == least])
        a, b = self.rng.sample(range(n), 2)
        return a if self.outstanding[a] <= self.outstanding[b] else b

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                if message["type"] == "lifespan.startup":
                    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
                    self.client = httpx.AsyncClient(timeout=60, limits=limits)
                    await send({"type": "lifespan.startup.complete"})
            assert self.client is not None
            await self.client.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/health":
            await _answer(send, 200, b"{}")
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body)
        worker = self.pick()
        request["model"] = f"{request['model']}-w{worker}"
        self.outstanding[worker] += 1
        try:
            assert self.client is not None
            r = await self.client.post(self.gateway + scope["path"], json=request)
            await _answer(send, r.status_code, r.content)
        finally:
            self.outstanding[worker] -= 1


async def _answer(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m perf.scale.router")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--policy", choices=POLICIES, required=True)
    args = parser.parse_args()
    app = PushRouter(args.gateway, args.workers, args.policy)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
