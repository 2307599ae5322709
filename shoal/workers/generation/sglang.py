"""The SGLang runtime: a supervised SGLang server, driven over its native HTTP API.

sglang pins a CUDA torch and library versions that clash with Shoal's, so it runs as its
own server process from its own environment (`generator.sglang_command`, e.g. that
environment's `python -m sglang.launch_server`). The worker starts it on a free loopback
port, waits for `GET /health` to answer 200, and keeps it saturated: it pulls up to
`--max-running-requests` sequences and streams each through `POST /generate`.

Protocol (SGLang's native API, see docs/basic_usage/native_api and sampling_params):
- request: `input_ids` (Shoal applies the chat template itself, so prompts and token
  counts are the same as on the transformers runtime), `sampling_params` (`max_new_tokens`,
  `temperature`, `top_p`, `stop`, penalties, `json_schema`, `sampling_seed`), `stream`,
  `rid`, `return_logprob` + `top_logprobs_num`, `lora_path` (an adapter's name);
- stream: `data: {...}` events whose `text` is cumulative (the server's default mode; do
  not pass `--incremental-streaming-output`), `meta_info.finish_reason` null until the
  end, then `{"type": "stop"|"length"|"abort"}`, ended by `data: [DONE]`;
- `POST /abort_request {"rid"}` stops a sequence (rids are 32 hex digits, so none is a
  prefix of another: SGLang matches rids by prefix);
- LoRA adapters are loaded on first use with `POST /load_lora_adapter`
  (the server needs LoRA enabled: add `--enable-lora --max-lora-rank R
  --lora-target-modules all` to `generator.sglang_args`).

If the server dies, every running sequence ends with an error (the worker naks the job:
it is redelivered and regenerated) and the server is started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import threading
import time
import uuid
from collections.abc import Callable

import httpx

from ...config import GeneratorSettings
from ...lifecycle import die_with_parent
from ...model_registry import ModelSpec
from ...queue.embedded import free_port
from .engine import SequenceRequest, TokenEvent
from .runtime import GenerationRuntime

__all__ = ["SGLangRuntime"]

log = logging.getLogger(__name__)


class SGLangRuntime(GenerationRuntime):
    """A supervised SGLang server, driven over its native HTTP API."""

    def __init__(self, spec: ModelSpec, max_running: int, settings: GeneratorSettings) -> None:
        super().__init__(spec, max_running)
        self._settings = settings
        self._process: subprocess.Popen | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="shoal-sglang", daemon=True
        )
        self._lock = threading.Lock()
        self._rids: dict[str, list[str]] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._requests: dict[str, SequenceRequest] = {}
        self._loras: set[str] = set()
        self._active = 0
        self._max_batch = 0
        self._stopping = False
        self.restarts = 0

    @property
    def engine_name(self) -> str:
        return "sglang"

    # Lifecycle ------------------------------------------------------------------------------

    def start(self, path: str, on_events: Callable[[list[TokenEvent]], None]) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self._path = path
        self._on_events = on_events
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        config = AutoConfig.from_pretrained(path)
        limit = getattr(config, "max_position_embeddings", None) or self.spec.max_length
        self._context = min(self.spec.max_length, limit)
        self._thread.start()
        self._launch()
        self._supervisor = asyncio.run_coroutine_threadsafe(self._supervise(), self._loop)

    def _launch(self) -> None:
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        command = [
            *self._settings.sglang_command,
            "--model-path", self._path,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--max-running-requests", str(self.max_running),
            *self._settings.sglang_args,
        ]  # fmt: skip
        log.info("starting SGLang: %s", " ".join(command))
        # Its own session (a Ctrl-C for the worker is the worker's to handle), and SIGTERM
        # when the thread that starts it ends, so a killed worker leaves no server behind.
        self._process = subprocess.Popen(
            command, start_new_session=True, preexec_fn=die_with_parent
        )
        deadline = time.monotonic() + self._settings.sglang_start_timeout
        while time.monotonic() < deadline:
            if self._stopping:  # `stop` may have come before the server existed
                self._process.kill()
                self._process.wait()
                raise RuntimeError("stopped while SGLang was starting")
            if self._process.poll() is not None:
                raise RuntimeError(f"SGLang exited with {self._process.returncode} while starting")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/health", timeout=5).status_code == 200:
                    self._client = httpx.AsyncClient(base_url=self.base_url, timeout=None)
                    self._loras.clear()
                    return
            time.sleep(0.25)
        self._process.kill()
        raise TimeoutError("SGLang did not become healthy in time")

    async def _supervise(self) -> None:
        while not self._stopping:
            await asyncio.sleep(0.5)
            if self._process is not None and self._process.poll() is not None:
                log.error("SGLang exited with %s; restarting it", self._process.returncode)
                failed = [
                    TokenEvent(req.job, req.choice, error="the SGLang server died")
                    for req in self._requests.values()
                ]
                for task in list(self._tasks.values()):
                    task.cancel()
                if failed:
                    self._on_events(failed)
                self.restarts += 1
                await asyncio.get_running_loop().run_in_executor(None, self._launch)

    def stop(self) -> None:
        self._stopping = True
        if getattr(self, "_supervisor", None) is not None:
            self._supervisor.cancel()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(2)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._loop.call_soon_threadsafe(self._loop.stop)

    # Interface -----------------------------------------------------------------------------------

    @property
    def context(self) -> int:
        return self._context

    @property
    def running(self) -> int:
        return self._active

    @property
    def max_batch(self) -> int:
        return self._max_batch

    def submit(self, requests: list[SequenceRequest]) -> None:
        for req in requests:
            rid = uuid.uuid4().hex
            with self._lock:
                self._rids.setdefault(req.job, []).append(rid)
                self._active += 1
                self._max_batch = max(self._max_batch, self._active)
            self._loop.call_soon_threadsafe(self._start_task, rid, req)

    def _start_task(self, rid: str, req: SequenceRequest) -> None:
        self._requests[rid] = req
        self._tasks[rid] = asyncio.ensure_future(self._generate(rid, req))

    def cancel(self, job: str) -> None:
        with self._lock:
            rids = self._rids.pop(job, [])
        for rid in rids:
            asyncio.run_coroutine_threadsafe(self._abort(rid), self._loop)

    async def _abort(self, rid: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self._client.post("/abort_request", json={"rid": rid})
        task = self._tasks.get(rid)
        if task is not None:
            task.cancel()

    # One sequence ----------------------------------------------------------------------------

    def _body(self, rid: str, req: SequenceRequest) -> dict:
        s = req.sampling
        params = {
            "max_new_tokens": req.max_new,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "frequency_penalty": s.frequency_penalty,
            "presence_penalty": s.presence_penalty,
            "sampling_seed": s.seed + req.choice,
        }
        if s.stop:
            params["stop"] = list(s.stop)
        if s.json_schema:
            params["json_schema"] = s.json_schema
        body = {"input_ids": req.prompt_ids, "sampling_params": params, "stream": True, "rid": rid}
        if s.logprobs:
            body.update(
                return_logprob=True, top_logprobs_num=s.top_logprobs, return_text_in_logprobs=True
            )
        if req.adapter:
            body["lora_path"] = req.adapter
        return body

    async def _generate(self, rid: str, req: SequenceRequest) -> None:
        text = ""
        tokens = 0
        seen_logprobs = 0
        try:
            if req.adapter and req.adapter not in self._loras:
                await self._load_lora(req.adapter, req.adapter_path)
            async with self._client.stream("POST", "/generate", json=self._body(rid, req)) as r:
                if not r.is_success:
                    detail = (await r.aread()).decode(errors="replace")[:300]
                    raise RuntimeError(f"SGLang answered {r.status_code}: {detail}")
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    out = json.loads(line[6:])
                    if "error" in out:
                        raise RuntimeError(f"SGLang: {out['error']}")
                    meta = out.get("meta_info", {})
                    full = out.get("text", "")
                    delta, text = full[len(text) :], full
                    done = meta.get("completion_tokens", tokens)
                    events = self._events(req, delta, done - tokens, meta, seen_logprobs)
                    seen_logprobs = len(meta.get("output_token_logprobs") or [])
                    tokens = done
                    finish = (meta.get("finish_reason") or {}).get("type")
                    if finish == "abort":
                        return
                    if finish:
                        events[-1].finish = "length" if finish == "length" else "stop"
                    self._on_events(events)
                    if finish:
                        return
        except asyncio.CancelledError:
            pass  # aborted by the client, or the server died (reported by _supervise)
        except Exception as exc:
            self._on_events([TokenEvent(req.job, req.choice, error=str(exc))])
        finally:
            self._tasks.pop(rid, None)
            self._requests.pop(rid, None)
            with self._lock:
                self._active -= 1
                rids = self._rids.get(req.job)
                if rids and rid in rids:
                    rids.remove(rid)

    def _events(
        self, req: SequenceRequest, delta: str, generated: int, meta: dict, seen: int
    ) -> list[TokenEvent]:
        events = [TokenEvent(req.job, req.choice, text=delta, generated=max(generated, 0))]
        if not req.sampling.logprobs:
            return events
        tops = meta.get("output_top_logprobs") or []
        for i, entry in enumerate((meta.get("output_token_logprobs") or [])[seen:]):
            logprob, _token_id, token = entry[0], entry[1], entry[2] or ""
            top = tops[seen + i] if seen + i < len(tops) and tops[seen + i] else []
            event = events[0] if i == 0 else TokenEvent(req.job, req.choice)
            event.token, event.logprob = token, float(logprob)
            event.token_bytes = list(token.encode())
            event.top = [(t or "", float(v), list((t or "").encode())) for v, _, t in top]
            if i:
                events.append(event)
        return events

    async def _load_lora(self, name: str, path: str) -> None:
        r = await self._client.post(
            "/load_lora_adapter", json={"lora_name": name, "lora_path": path}
        )
        if not r.is_success:
            raise RuntimeError(f"SGLang could not load adapter {name!r}: {r.text[:300]}")
        self._loras.add(name)
