"""Running generation jobs through the queue for the chat and completions routes.

A request becomes one job per prompt (each with its `n` choices); their chunks are
assembled (shoal/queue/streams.py) and merged into one stream of client-facing deltas.
Leaving the iteration early (the client disconnected) cancels every job on its worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import msgspec

from ..compat.errors import BadGatewayError
from ..queue import GenerateJob
from ..queue.messages import ChoiceDelta
from ..queue.streams import StreamAssembler, StreamDivergedError
from .admission import meter_usage
from .errors import as_shoal_error
from .gateway import Gateway

__all__ = ["Generation"]

_DONE = object()


class Generation:
    """Iterate for lists of deltas; afterwards `prompt_tokens`, `completion_tokens` and
    `prompts` (the echoed prompt per choice) are set (a `DeltaStream` for compat's
    renderers)."""

    def __init__(self, gateway: Gateway, jobs: list[GenerateJob], model: str) -> None:
        self._gateway = gateway
        self._jobs = jobs
        self.model = model
        """The model's name in responses."""
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.choices = sum(job.n for job in jobs)
        self.prompts = [""] * self.choices
        self._queue: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        """Publish every job, and return once the queue holds them all. A streamed
        response calls this before it starts: the worker then prefills while the
        response's headers go out (the first token comes ~1 ms sooner:
        perf/results/README.md), and a refusal (no worker, a full queue, NATS away) is
        the response's own status, not an error event after a 200. Iterating starts the
        jobs where this was not called.

        Raises:
            ShoalError: a job was refused; none of the request's jobs runs on.
        """
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        deadline = time.time() + self._gateway.request_timeout
        published = [loop.create_future() for _ in self._jobs]
        self._tasks = [
            asyncio.create_task(self._run(job, deadline, done))
            for job, done in zip(self._jobs, published, strict=True)
        ]
        try:
            for outcome in await asyncio.gather(*published, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    raise outcome
        except BaseException:
            await self._stop()
            raise

    async def __aiter__(self) -> AsyncIterator[list[ChoiceDelta]]:
        try:
            await self.start()
            running = len(self._tasks)
            while running:
                item = await self._queue.get()
                if item is _DONE:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                elif item:
                    yield item
        finally:
            await self._stop()

    async def _stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self, job: GenerateJob, deadline: float, published: asyncio.Future) -> None:
        dispatcher = self._gateway.dispatcher
        request_id = f"{job.request_id}.{job.part}"
        assembler = StreamAssembler(job.first_index, job.n)
        queue = self._queue

        def on_published() -> None:
            if not published.done():  # done: `start` was cancelled meanwhile
                published.set_result(None)

        try:
            stream = dispatcher.stream(
                request_id,
                _with_id(job, request_id),
                self._gateway.lane,
                deadline,
                on_published,
            )
            async with contextlib.aclosing(stream):
                async for chunk in stream:
                    deltas = assembler.feed(chunk)
                    if assembler.prompt and not self.prompts[job.first_index]:
                        for i in range(job.n):
                            self.prompts[job.first_index + i] = assembler.prompt
                    queue.put_nowait(deltas)
            self.prompt_tokens += assembler.prompt_tokens
            self.completion_tokens += assembler.completion_tokens
            meter_usage(assembler.prompt_tokens + assembler.completion_tokens)
            queue.put_nowait(_DONE)
        except StreamDivergedError:
            queue.put_nowait(
                BadGatewayError(
                    "the worker generating this response failed and its retry produced different "
                    "text; retry the request"
                )
            )
        except asyncio.CancelledError:
            if not published.done():
                published.cancel()
            raise
        except Exception as exc:
            error = as_shoal_error(exc, self.model)
            if published.done():
                queue.put_nowait(error)
            else:  # refused before the queue held it: `start` raises it
                published.set_exception(error)


def _with_id(job: GenerateJob, request_id: str) -> GenerateJob:
    return msgspec.structs.replace(job, request_id=request_id)
