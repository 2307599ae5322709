"""Subject, stream and consumer names, in one place.

    {prefix}.work.{lane}.{model}.{op}   work items (JetStream, WorkQueue retention)
    {prefix}.reply.{gateway}            results for one gateway (core NATS)
    {prefix}.heartbeat                  worker liveness and the models each serves
    {prefix}.cancel                     request ids nobody waits for any more
    {prefix}.dead.{model}               dead letters (JetStream, limits retention)

Each (lane, model) pair has one durable consumer whose filter is
`{prefix}.work.{lane}.{model}.*`: filters of different pairs never overlap, which a
WorkQueue stream requires, and every worker serving a model shares that model's consumer,
so JetStream hands each item to exactly one of them. Model ids are escaped into one
subject token reversibly (`/` and `.` would otherwise split or break tokens).
"""

from __future__ import annotations

from typing import Literal

__all__ = ["EVERY_MODEL", "Lane", "Subjects", "Task", "model_token", "token_model"]

Lane = Literal["interactive", "batch"]
Task = Literal[
    "embed", "multivector", "ner", "classify", "rerank", "sparse", "generate", "tokenize"
]
"""What a model does and what a job asks of it (its work subject's last token)."""
EVERY_MODEL: frozenset[str] = frozenset({"tokenize"})
"""Tasks every model serves whatever its spec's `tasks` say."""

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")


def model_token(model_id: str) -> str:
    """`model_id` as one subject token and consumer-name part: `[A-Za-z0-9_-]` only."""
    out: list[str] = []
    for char in model_id:
        if char in _SAFE:
            out.append(char)
        else:
            out.extend(f"_{byte:02x}" for byte in char.encode())
    return "".join(out)


def token_model(token: str) -> str:
    """The inverse of `model_token`."""
    raw = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "_":
            raw.append(int(token[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(token[i].encode())
            i += 1
    return raw.decode()


class Subjects:
    """Names for one Shoal deployment, all under `prefix`."""

    def __init__(self, prefix: str = "shoal") -> None:
        self.prefix = prefix

    @property
    def all_work(self) -> str:
        return f"{self.prefix}.work.>"

    def work(self, lane: Lane, model_id: str, op: Task) -> str:
        return f"{self.prefix}.work.{lane}.{model_token(model_id)}.{op}"

    def work_filter(self, lane: Lane, model_id: str) -> str:
        return f"{self.prefix}.work.{lane}.{model_token(model_id)}.*"

    @staticmethod
    def consumer(lane: Lane, model_id: str) -> str:
        return f"{lane}-{model_token(model_id)}"

    def reply(self, gateway_id: str) -> str:
        return f"{self.prefix}.reply.{gateway_id}"

    @property
    def heartbeat(self) -> str:
        return f"{self.prefix}.heartbeat"

    @property
    def all_dead(self) -> str:
        return f"{self.prefix}.dead.>"

    def dead(self, model_id: str) -> str:
        """Dead letters of one model: items that will never succeed."""
        return f"{self.prefix}.dead.{model_token(model_id)}"

    @property
    def cancel(self) -> str:
        """Request ids whose work should stop (the client went away)."""
        return f"{self.prefix}.cancel"
