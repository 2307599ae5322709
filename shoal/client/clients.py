"""`Client` (sync) and `AsyncClient`: the native routes over a keep-alive connection pool.

Both offer the same operations, defined once in `_Operations` on top of two primitives
each client implements: `_run` (one call, retried per `RetryPolicy`) and `_map` (batches
of an iterable, `concurrency` requests in flight, results in input order, memory bounded
by the requests in flight). On `AsyncClient` every operation is awaited and every
`*_iter` is an async iterator.

    with Client("http://127.0.0.1:8000") as client:
        for vectors in client.embed_iter(lines, model="all-MiniLM-L6-v2", batch_size=256):
            ...  # numpy (rows, dims), in input order
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from itertools import islice
from typing import Any, TypeVar

import httpx

from . import calls
from .calls import Call, Dtype, EmbedDtype, Parsed, RetryPolicy
from .errors import ShoalAPIError, error_from_response

__all__ = ["DEFAULT_URL", "AsyncClient", "Client"]

DEFAULT_URL = "http://127.0.0.1:8000"
T = TypeVar("T")
X = TypeVar("X")


class _Operations:
    """The operations; `_run` and `_map` do the I/O (sync or async), over the HTTP
    client `_open` makes."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_connections: int = 16,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.retry = retry or RetryPolicy()
        self.prompt_tokens = 0
        """Tokens the server reported for every answered call."""
        self.retries = 0
        """Calls tried again (429, 503, dropped connections)."""
        self._lock = threading.Lock()
        self._http = self._open(
            base_url=base_url.rstrip("/"),
            timeout=timeout,
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            headers={"authorization": f"Bearer {api_key}"} if api_key else {},
        )

    def _open(self, **options: Any) -> Any:
        raise NotImplementedError

    def _run(self, call: Call[Any]) -> Any:
        raise NotImplementedError

    def _map(
        self, make: Callable[[list[Any]], Call[Any]], items: Any, batch_size: int, concurrency: int
    ) -> Any:
        raise NotImplementedError

    def embed(
        self,
        texts: Sequence[str],
        *,
        model: str,
        dtype: EmbedDtype = "float32",
        dimensions: int | None = None,
        truncate: bool = True,
        adapter: str | None = None,
    ) -> Any:
        """`(len(texts), dims)` numpy vectors, a view on the response's bytes."""
        return self._run(calls.embed(texts, model, dtype, dimensions, truncate, adapter))

    def embed_iter(
        self,
        texts: Iterable[str] | AsyncIterable[str],
        *,
        model: str,
        batch_size: int = 256,
        concurrency: int = 4,
        dtype: EmbedDtype = "float32",
        dimensions: int | None = None,
        truncate: bool = True,
        adapter: str | None = None,
    ) -> Any:
        """Any number of texts: one `(rows, dims)` array per `batch_size` texts, in input
        order, with `concurrency` requests in flight."""
        make = partial(
            calls.embed,
            model=model,
            dtype=dtype,
            dimensions=dimensions,
            truncate=truncate,
            adapter=adapter,
        )
        return self._map(make, texts, batch_size, concurrency)

    def ner(
        self,
        texts: Sequence[str],
        *,
        model: str,
        aggregation: str = "simple",
        labels: Sequence[str] | None = None,
        threshold: float = 0.0,
        adapter: str | None = None,
    ) -> Any:
        """Each text's entities."""
        return self._run(calls.ner(texts, model, aggregation, labels, threshold, adapter))

    def ner_iter(
        self,
        texts: Iterable[str] | AsyncIterable[str],
        *,
        model: str,
        batch_size: int = 64,
        concurrency: int = 4,
        aggregation: str = "simple",
        labels: Sequence[str] | None = None,
        threshold: float = 0.0,
        adapter: str | None = None,
    ) -> Any:
        """One list of per-text entity lists per `batch_size` texts, in input order."""
        make = partial(
            calls.ner,
            model=model,
            aggregation=aggregation,
            labels=labels,
            threshold=threshold,
            adapter=adapter,
        )
        return self._map(make, texts, batch_size, concurrency)

    def multivector(
        self,
        texts: Sequence[str],
        *,
        model: str,
        dtype: Dtype = "float32",
        normalize: bool = True,
        skip_special: bool = True,
        skip_punctuation: bool = False,
        truncate: bool = True,
        adapter: str | None = None,
    ) -> Any:
        """One `(tokens, dims)` array per text."""
        return self._run(
            calls.multivector(
                texts, model, dtype, normalize, skip_special, skip_punctuation, truncate, adapter
            )
        )

    def multivector_iter(
        self,
        texts: Iterable[str] | AsyncIterable[str],
        *,
        model: str,
        batch_size: int = 64,
        concurrency: int = 4,
        dtype: Dtype = "float32",
        normalize: bool = True,
        skip_special: bool = True,
        skip_punctuation: bool = False,
        truncate: bool = True,
        adapter: str | None = None,
    ) -> Any:
        """One list of per-text arrays per `batch_size` texts, in input order."""
        make = partial(
            calls.multivector,
            model=model,
            dtype=dtype,
            normalize=normalize,
            skip_special=skip_special,
            skip_punctuation=skip_punctuation,
            truncate=truncate,
            adapter=adapter,
        )
        return self._map(make, texts, batch_size, concurrency)

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        model: str,
        truncate: bool = True,
        adapter: str | None = None,
    ) -> Any:
        """Each document's relevance score, in the documents' order."""
        return self._run(calls.rerank(query, documents, model, truncate, adapter))

    def rerank_iter(
        self,
        pairs: Iterable[tuple[str, Sequence[str]]] | AsyncIterable[tuple[str, Sequence[str]]],
        *,
        model: str,
        concurrency: int = 4,
        truncate: bool = True,
        adapter: str | None = None,
    ) -> Any:
        """Scores for each `(query, documents)` pair, in input order."""

        def make(batch: list[tuple[str, Sequence[str]]]) -> Call[Any]:
            [(query, documents)] = batch
            return calls.rerank(query, documents, model, truncate, adapter)

        return self._map(make, pairs, 1, concurrency)


def _batched(items: Iterable[X], size: int) -> Iterator[list[X]]:
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


async def _abatched(items: Iterable[X] | AsyncIterable[X], size: int) -> AsyncIterator[list[X]]:
    if not isinstance(items, AsyncIterable):
        for batch in _batched(items, size):
            yield batch
        return
    batch: list[X] = []
    async for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class _Attempts:
    """Counts the tries of one call; says how long to wait, or raises the failure."""

    def __init__(self, retry: RetryPolicy) -> None:
        self.retry = retry
        self.count = 0

    def wait_after(self, failure: Exception) -> float:
        delay = self.retry.delay(self.count, failure)
        if delay is None:
            raise failure
        self.count += 1
        return delay


def _read(call: Call[T], response: httpx.Response) -> Parsed[T] | ShoalAPIError:
    if response.status_code == 200:
        return call.parse(response.content)
    return error_from_response(response)


class Client(_Operations):
    """Sync client; thread-safe. `prompt_tokens` counts the tokens the server embedded."""

    def _open(self, **options: Any) -> httpx.Client:
        return httpx.Client(**options)

    def _wait(self, seconds: float) -> None:
        with self._lock:
            self.retries += 1
        time.sleep(seconds)

    def _run(self, call: Call[T]) -> T:
        attempts = _Attempts(self.retry)
        while True:
            try:
                response = self._http.post(call.path, content=call.body, headers=call.headers)
            except httpx.TransportError as exc:
                self._wait(attempts.wait_after(exc))
                continue
            result = _read(call, response)
            if isinstance(result, Exception):
                self._wait(attempts.wait_after(result))
                continue
            with self._lock:
                self.prompt_tokens += result.prompt_tokens
            return result.value

    def _map(
        self,
        make: Callable[[list[X]], Call[T]],
        items: Iterable[X],
        batch_size: int,
        concurrency: int,
    ) -> Iterator[T]:
        pool = ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="shoal-client")
        in_flight: deque[Future[T]] = deque()
        try:
            for batch in _batched(items, batch_size):
                in_flight.append(pool.submit(self._run, make(batch)))
                if len(in_flight) >= concurrency:
                    yield in_flight.popleft().result()
            while in_flight:
                yield in_flight.popleft().result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Operations):
    """Async client: `await client.embed(...)`, `async for v in client.embed_iter(...)`."""

    def _open(self, **options: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(**options)

    async def _wait(self, seconds: float) -> None:
        self.retries += 1
        await asyncio.sleep(seconds)

    async def _run(self, call: Call[T]) -> T:
        attempts = _Attempts(self.retry)
        while True:
            try:
                response = await self._http.post(call.path, content=call.body, headers=call.headers)
            except httpx.TransportError as exc:
                await self._wait(attempts.wait_after(exc))
                continue
            result = _read(call, response)
            if isinstance(result, Exception):
                await self._wait(attempts.wait_after(result))
                continue
            self.prompt_tokens += result.prompt_tokens
            return result.value

    async def _map(
        self,
        make: Callable[[list[X]], Call[T]],
        items: Iterable[X] | AsyncIterable[X],
        batch_size: int,
        concurrency: int,
    ) -> AsyncIterator[T]:
        in_flight: deque[asyncio.Task[T]] = deque()
        try:
            async for batch in _abatched(items, batch_size):
                in_flight.append(asyncio.create_task(self._run(make(batch))))
                if len(in_flight) >= concurrency:
                    yield await in_flight.popleft()
            while in_flight:
                yield await in_flight.popleft()
        finally:
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
