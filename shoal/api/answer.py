"""The one path of every request, from any route: resolve the model, build the jobs,
submit them, render the answer.

Encoder requests (embeddings, NER, multi-vector, rerank, classify; JSON or native)
implement `TaskRequest`: `answer` runs them. Generation requests (chat, completions) go
through `generate`, which streams or collects. The routes, the native routes and the
batch runner's lines all call these, so a batch line is answered exactly as the same
request sent live (the batch runner passes a gateway on the batch lane).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol

import msgspec
from litestar import Response
from litestar.response import Stream

from ..compat.errors import ShoalError
from ..compat.extensions import ShoalOptions
from ..compat.openai.chat import ChatCompletionRequest
from ..compat.openai.completions import CompletionRequest
from ..compat.openai.responses import ResponseRequest
from ..queue.messages import Result
from .endpoints import batchable
from .gateway import Gateway, JobsRequest, Target
from .generation import Generation
from .json_lines import one_line

__all__ = [
    "BATCH_ENDPOINTS",
    "Answer",
    "Endpoint",
    "TaskRequest",
    "answer",
    "generate",
    "results_of",
    "start_generation",
]

SSE = "text/event-stream"


class TaskRequest(JobsRequest, Protocol):
    """An encoder request, JSON or native: which task its model must serve, its jobs,
    and its response from their results."""

    op: ClassVar[str]
    model: str
    shoal: ShoalOptions | None

    def respond(self, results: Sequence[Any], model: str) -> msgspec.Struct: ...


class Answer(NamedTuple):
    """An encoder response body and its timing headers."""

    body: msgspec.Struct
    headers: dict[str, str]
    """Timing (`x-queue-time`, `x-inference-time`, in ms), as TEI sends them."""


async def results_of(gateway: Gateway, request: TaskRequest) -> tuple[list[Result], Target]:
    """Resolve, build the jobs, run them through the queue: the results in order."""
    target = gateway.resolve(request.model, request.op, request.shoal)
    results = await gateway.run(target, request)
    return results, target


async def answer(gateway: Gateway, request: TaskRequest) -> Answer:
    """An encoder request's response and its timing headers. A request that may ask for
    int8/uint8 vectors has `ranges_dims(spec)` (the dimension count whose calibration
    range its answer needs, or None) and takes that range as `respond`'s third argument."""
    results, target = await results_of(gateway, request)
    dims = request.ranges_dims(target.spec) if hasattr(request, "ranges_dims") else None
    if dims is not None:
        ranges = await gateway.calibrations.ranges(
            target.spec, target.adapter, dims, lambda r: gateway.run(target, r)
        )
        body = request.respond(results, target.name, ranges)  # type: ignore[call-arg]
    else:
        body = request.respond(results, target.name)
    timing = {
        "x-queue-time": f"{max(r.queue_ms for r in results):.2f}",
        "x-inference-time": f"{max(r.inference_ms for r in results):.2f}",
    }
    return Answer(body, timing)


GenerationRequest = ChatCompletionRequest | CompletionRequest | ResponseRequest


def start_generation(gateway: Gateway, request: GenerationRequest) -> Generation:
    """Resolve and build the jobs; iterating the generation runs them."""
    target = gateway.resolve(request.model, "generate", request.shoal)
    jobs = gateway.prepare(target, request)
    return Generation(gateway, jobs, target.name)  # type: ignore[arg-type]


async def generate(gateway: Gateway, request: GenerationRequest) -> Response | Stream:
    """A chat or completion response: streamed as SSE when the request asks, else whole."""
    generation = start_generation(gateway, request)
    if request.stream:
        await generation.start()  # published before the response starts (see `start`)
        # Chat and completions streams end with `data: [DONE]`; the Responses API's ends
        # at its last event (`response.completed`, `response.incomplete` or `error`).
        done = not isinstance(request, ResponseRequest)
        return Stream(_sse(request.events(generation), done), media_type=SSE)
    return Response(await request.collect(generation))


async def _sse(events: AsyncIterator[msgspec.Struct], done: bool) -> AsyncIterator[bytes]:
    """Server-sent events as OpenAI sends them. An error after the stream started cannot
    change the status any more: it goes as an OpenAI error event, then the stream ends
    (the Responses API's events send their own typed `error` event instead)."""
    try:
        async for event in events:
            # The Responses API names each event in an `event:` line too.
            kind = getattr(event, "type", None)
            named = b"event: " + kind.encode() + b"\n" if isinstance(kind, str) else b""
            yield named + b"data: " + one_line(event) + b"\n\n"
    except ShoalError as exc:
        yield b"data: " + one_line(exc.to_response()) + b"\n\n"
    if done:
        yield b"data: [DONE]\n\n"


class Endpoint(NamedTuple):
    """A route a batch may target: its body type, the task its model must serve, and
    what answers one body."""

    request: type[msgspec.Struct]
    op: str
    call: Callable[[Gateway, Any], Awaitable[msgspec.Struct]]
    streams: bool = False
    """Whether the body has a `stream` flag (refused in batches)."""


async def _answer_body(gateway: Gateway, request: TaskRequest) -> msgspec.Struct:
    return (await answer(gateway, request)).body


async def _collect(gateway: Gateway, request: GenerationRequest) -> msgspec.Struct:
    return await request.collect(start_generation(gateway, request))


def _endpoint(request: type[msgspec.Struct]) -> Endpoint:
    if issubclass(request, GenerationRequest):
        return Endpoint(request, "generate", _collect, streams=True)
    return Endpoint(request, request.op, _answer_body)  # type: ignore[attr-defined]


BATCH_ENDPOINTS: dict[str, Endpoint] = {
    path: _endpoint(request) for path, request in batchable().items()
}
"""The routes a batch line may name (endpoints.py lists them)."""
