"""The soak's traffic: each route's request, and the check that its answer is whole.

A request counts once, with its status and, for a 2xx, whether the answer is whole: every
input answered once (embeddings and rerank indices a permutation of the inputs, a native
matrix of the right shape), a stream with one finish and one end. An answer that is not
whole is a `problem`: the soak's one hard failure. A stream that ends with an error event
failed in the open (counted as a 502), as a status would say.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field

import httpx
import msgspec

from tests.helpers import GEN_MODEL, MODEL

RERANKER = "test-reranker"
SHARES = {"embeddings": 0.60, "chat": 0.15, "rerank": 0.10, "native": 0.10, "responses": 0.05}
"""The live mix: most traffic embeds, some chats (streamed), reranks, bulk-embeds and asks
for a tool through the Responses API."""
ADD_TOOL = {
    "type": "function",
    "name": "add",
    "description": "Add two integers",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
WORDS = [
    "river",
    "stone",
    "cloud",
    "lantern",
    "harbor",
    "maple",
    "signal",
    "copper",
    "meadow",
    "violet",
]


@dataclass
class Sent:
    """One request of the soak."""

    route: str
    started: float
    """Seconds since the soak began."""
    seconds: float = 0.0
    status: int = 0
    """HTTP status; 0: no answer (the connection failed)."""
    problem: str = ""
    """For a 2xx, what was wrong with the answer ("" when whole)."""


@dataclass
class Traffic:
    """Sends the mix against `base`, seeded."""

    base: str
    seed: int = 0
    sent: list[Sent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def pick(self) -> str:
        return self._rng.choices(list(SHARES), weights=list(SHARES.values()))[0]

    def texts(self, n: int) -> list[str]:
        return [" ".join(self._rng.choices(WORDS, k=self._rng.randint(4, 24))) for _ in range(n)]

    async def send(self, client: httpx.AsyncClient, route: str, began: float) -> None:
        record = Sent(route, time.monotonic() - began)
        self.sent.append(record)
        clock = time.monotonic()
        try:
            record.status, record.problem = await getattr(self, f"_{route}")(client)
        except httpx.HTTPError as exc:
            record.status, record.problem = 0, type(exc).__name__
        except Exception as exc:  # an answer it cannot read (a broken stream line): say so
            record.status, record.problem = 0, repr(exc)[:200]
        record.seconds = time.monotonic() - clock

    async def _embeddings(self, client: httpx.AsyncClient) -> tuple[int, str]:
        texts = self.texts(4)
        r = await client.post("/v1/embeddings", json={"model": MODEL, "input": texts})
        if r.status_code != 200:
            return r.status_code, ""
        indices = [d["index"] for d in r.json()["data"]]
        return 200, "" if indices == list(range(len(texts))) else f"indices {indices}"

    async def _rerank(self, client: httpx.AsyncClient) -> tuple[int, str]:
        docs = self.texts(8)
        body = {"model": RERANKER, "query": docs[3], "documents": docs}
        r = await client.post("/v1/rerank", json=body)
        if r.status_code != 200:
            return r.status_code, ""
        ranked = sorted(result["index"] for result in r.json()["results"])
        return 200, "" if ranked == list(range(len(docs))) else f"ranked {ranked}"

    async def _native(self, client: httpx.AsyncClient) -> tuple[int, str]:
        texts = self.texts(32)
        r = await client.post(
            "/native/v1/embed",
            content=msgspec.msgpack.encode({"model": MODEL, "inputs": texts}),
            headers={"content-type": "application/msgpack"},
        )
        if r.status_code != 200:
            return r.status_code, ""
        answer = msgspec.msgpack.decode(r.content)
        shape = list(answer["shape"])
        whole = shape == [len(texts), 384] and len(answer["data"]) == len(texts) * 384 * 4
        return 200, "" if whole else f"shape {shape}, {len(answer['data'])} bytes"

    async def _chat(self, client: httpx.AsyncClient) -> tuple[int, str]:
        body = {
            "model": GEN_MODEL,
            "messages": [{"role": "user", "content": self.texts(1)[0]}],
            "max_tokens": 16,
            "stream": True,
        }
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return r.status_code, ""
            finishes, done, after_done = 0, 0, 0
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if done:
                    after_done += 1
                elif line == "data: [DONE]":
                    done += 1
                else:
                    chunk = json.loads(line[6:])
                    if "error" in chunk:  # failed in the open, as OpenAI does: not lost
                        return 502, ""
                    finishes += sum(1 for c in chunk["choices"] if c.get("finish_reason"))
            whole = (finishes, done, after_done) == (1, 1, 0)
            return 200, "" if whole else f"finishes {finishes}, [DONE] {done}, after {after_done}"

    async def _responses(self, client: httpx.AsyncClient) -> tuple[int, str]:
        body = {
            "model": GEN_MODEL,
            "input": f"What is {self._rng.randint(1, 9)} plus {self._rng.randint(1, 9)}?",
            "tools": [ADD_TOOL],
            "max_output_tokens": 24,
        }
        r = await client.post("/v1/responses", json=body)
        if r.status_code != 200:
            return r.status_code, ""
        answer = r.json()
        whole = answer["status"] in ("completed", "incomplete") and answer["output"]
        return 200, "" if whole else f"status {answer['status']}, output {answer['output']}"


def batch_lines(n: int, seed: int = 1) -> bytes:
    """`n` synthetic chat lines for the Batches API, each with its own custom id."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        topic = " ".join(rng.choices(WORDS, k=3))
        body = {
            "model": GEN_MODEL,
            "messages": [{"role": "user", "content": f"Write one line about {topic}."}],
            "max_tokens": 12,
        }
        lines.append(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": body,
            }
        )
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)
