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

    async def __aiter__(self) -> AsyncIterator[list[ChoiceDelta]]:
        queue: asyncio.Queue = asyncio.Queue()
        deadline = time.time() + self._gateway.request_timeout
        tasks = [asyncio.create_task(self._run(job, queue, deadline)) for job in self._jobs]
        try:
            running = len(tasks)
            while running:
                item = await queue.get()
                if item is _DONE:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                elif item:
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, job: GenerateJob, queue: asyncio.Queue, deadline: float) -> None:
        dispatcher = self._gateway.dispatcher
        request_id = f"{job.request_id}.{job.part}"
        assembler = StreamAssembler(job.first_index, job.n)
        try:
            stream = dispatcher.stream(
                request_id, _with_id(job, request_id), self._gateway.lane, deadline
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
            raise
        except Exception as exc:
            queue.put_nowait(as_shoal_error(exc, self.model))


def _with_id(job: GenerateJob, request_id: str) -> GenerateJob:
    return msgspec.structs.replace(job, request_id=request_id)
