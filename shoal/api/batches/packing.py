"""Packing embeddings lines: consecutive lines of a batch with the same model and options
travel as one queued request, and their answers are cut apart again.

Most batch files carry one input per line. Sent as one request each, every input would
pay a request's costs (queue messages, replies, acks, the gateway's bookkeeping), which
on a small model cost more than its forward pass. A pack pays them once for up to
`pack_inputs` inputs. Each line still gets exactly what the live route would give it:
its own rows, indexed from 0, and its own usage (workers report tokens per row).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import msgspec

from ...compat.embed import Vectors, join_vectors
from ...compat.errors import ShoalError
from ...compat.openai import EmbeddingRequest, EmbeddingResponse
from ..answer import results_of

if TYPE_CHECKING:
    from ..gateway import Gateway

__all__ = ["Pack", "PackedLine", "packed_line"]

_encode = msgspec.json.Encoder().encode


class PackedLine(NamedTuple):
    """An embeddings line, decoded, ready to travel in a pack."""

    index: int
    custom_id: str
    raw: bytes
    """The line as read, to answer it alone if its pack is refused."""
    body: EmbeddingRequest
    texts: list[str]
    token_ids: list[list[int]]

    @property
    def count(self) -> int:
        return len(self.texts) or len(self.token_ids)

    @property
    def key(self) -> tuple:
        """What lines of one pack must share: everything that shapes the answer but the
        inputs (`user` shapes nothing)."""
        body = self.body
        adapter = body.shoal.adapter if body.shoal else None
        kind = "texts" if self.texts else "token_ids"
        return (body.model, adapter, body.encoding_format, body.dimensions, body.truncate, kind)


def packed_line(index: int, custom_id: str, raw: bytes, body: object) -> PackedLine | None:
    """The line ready to pack, or None when it must go alone (not an embeddings body, or
    inputs the live route refuses: it answers them with the same error alone)."""
    if not isinstance(body, EmbeddingRequest):
        return None
    try:
        texts, token_ids = body.inputs()
    except ShoalError:
        return None
    return PackedLine(index, custom_id, raw, body, texts, token_ids)


class Pack:
    """Consecutive embeddings lines sent as one request, answered line by line."""

    def __init__(self, first: PackedLine, max_inputs: int) -> None:
        self.lines = [first]
        self.key = first.key
        self.inputs = first.count
        self.max_inputs = max_inputs

    def offer(self, line: PackedLine) -> bool:
        """Take the line if it shares the pack's key and fits."""
        if line.key != self.key or self.inputs + line.count > self.max_inputs:
            return False
        self.lines.append(line)
        self.inputs += line.count
        return True

    async def embed(self, gateway: Gateway) -> tuple[Vectors, str]:
        """Every line's inputs in one request; the vectors and the model's public name.

        Raises:
            ShoalError: as the live route would for a request of all these inputs.
        """
        first = self.lines[0].body
        texts = [t for line in self.lines for t in line.texts]
        token_ids = [ids for line in self.lines for ids in line.token_ids]
        merged = msgspec.structs.replace(first, input=texts or token_ids)
        results, target = await results_of(gateway, merged)
        return join_vectors(results), target.name

    def answers(self, vectors: Vectors, model: str) -> list[bytes]:
        """Each line's response body, in the pack's order."""
        if len(vectors.row_tokens) != vectors.rows:
            raise ValueError("the worker did not report tokens per row")
        bodies = []
        start = 0
        for line in self.lines:
            rows = vectors.rows_between(start, start + line.count)
            start += line.count
            response = EmbeddingResponse.from_vectors(rows, model, line.body.encoding_format)
            bodies.append(_encode(response))
        return bodies
