"""The private stack `shoal tune` measures on (nats-server, one worker for the model, one
gateway, on loopback), and the loads it offers: embeddings requests or short chat turns."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import msgspec

from ..config import Settings
from ..lifecycle import die_with_parent
from ..model_registry import BatchProfile, LiveRegistry, ModelRegistry, ModelSpec
from ..queue.embedded import EmbeddedNats, ServerAuth, free_port
from ..queue.nats import Bus, NatsKeyValue
from ..supervisor import Child, write_private
from .knee import Load

__all__ = ["CHAT_MAX_TOKENS", "TuneStack", "chat_load", "embed_load"]

CHAT_MAX_TOKENS = 32
_READY_S = 300.0


class TuneStack:
    """nats-server, one worker serving the model and a gateway, on loopback."""

    def __init__(self, settings: Settings, spec: ModelSpec, run_dir: Path) -> None:
        self.spec = spec
        self.generate = "generate" in spec.tasks
        self.run_dir = run_dir
        self.nats = EmbeddedNats(run_dir / "nats", auth=ServerAuth.generate())
        # A deep copy: the caller's settings still name the user's own NATS server.
        self.settings = msgspec.json.decode(msgspec.json.encode(settings), type=Settings)
        self.worker: Child | None = None
        self.gateway: Child | None = None
        self.bus: Bus | None = None
        self.kv: NatsKeyValue | None = None
        self.registry: LiveRegistry | None = None
        self.base = ""
        self.config = run_dir / "settings.json"

    async def start(self) -> None:
        self.nats.start(log_file=self.run_dir / "nats-server.log", preexec_fn=die_with_parent)
        s = self.settings
        s.nats = self.nats.client_settings(s.nats)
        s.worker.models = [self.spec.id]
        s.worker.pinned = [self.spec.id]
        s.generator.models, s.generator.max_running = [self.spec.id], 0
        s.gateway.host, s.gateway.port = "127.0.0.1", free_port()
        s.telemetry.metrics_port = 0
        s.batches.run_batches = False
        s.objects.backend, s.objects.local_dir = "local", str(self.run_dir / "objects")
        self.base = f"http://127.0.0.1:{s.gateway.port}"
        config = self.config
        write_private(config, msgspec.json.encode(s))  # it holds the NATS password
        self.bus = await Bus.connect(s.nats, "shoal-tune")
        static = ModelRegistry.from_files(*s.spec_files)
        self.kv = await self.bus.key_value(s.nats.registry_bucket)
        self.registry = LiveRegistry(static, self.kv)
        await self.registry.start()
        self.gateway = Child("gateway", ["gateway", "--config", str(config)], self._log("gateway"))
        self._start_worker()

    def _log(self, name: str) -> Path:
        return self.run_dir / f"{name}.log"

    def _start_worker(self) -> None:
        args = ["worker", "--config", str(self.config)]
        if self.generate:
            args += ["--kind", "generate"]
        self.worker = Child("worker", args, self._log("worker"))

    async def apply(self, profile: BatchProfile, restart: bool) -> None:
        """Serve the model with `profile`: live, or by restarting the worker."""
        assert self.registry is not None
        await self.registry.set_profile(self.spec.id, profile)
        if restart:
            assert self.worker is not None
            self.worker.stop(timeout=30.0)
            self._start_worker()
        else:
            await asyncio.sleep(0.3)  # the worker's registry watch applies it

    async def wait_served(self, load: Load, client: httpx.AsyncClient) -> None:
        """Until the model answers through the gateway (a loaded, ready worker)."""
        deadline = time.monotonic() + _READY_S
        while time.monotonic() < deadline:
            for child in (self.worker, self.gateway):
                if child is not None and not child.alive():
                    tail = self._log(child.name).read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"the {child.name} exited:\n{tail}")
            units, _ = await load.one(client)
            if units:
                return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"{self.spec.id} not served within {_READY_S:.0f}s")

    async def close(self) -> None:
        for child in (self.gateway, self.worker):
            if child is not None:
                child.stop(timeout=30.0)
        if self.kv is not None:
            await self.kv.close()
        if self.bus is not None:
            await self.bus.close()
        self.nats.stop()


def embed_load(base: str, model: str, sample: list[str], per_request: int) -> Load:
    bodies = [
        {"model": model, "input": sample[i : i + per_request], "encoding_format": "base64"}
        for i in range(0, len(sample) - per_request + 1, per_request)
    ]

    def count(answer: dict) -> int:
        return per_request if len(answer["data"]) == per_request else 0

    return Load(f"{base}/v1/embeddings", bodies, per_request, count)


def chat_load(base: str, model: str, sample: list[str]) -> Load:
    bodies = [
        {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": CHAT_MAX_TOKENS,
            "temperature": 0,
        }
        for text in sample
    ]

    def count(answer: dict) -> int:
        return answer["usage"]["completion_tokens"] if answer["choices"] else 0

    return Load(f"{base}/v1/chat/completions", bodies, CHAT_MAX_TOKENS, count)
