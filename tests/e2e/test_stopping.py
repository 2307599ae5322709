"""Every Shoal process stops within 10 s of SIGINT/SIGTERM in every phase, and leaves no
process behind: `shoal serve` (before NATS is up, while models load, while NATS is
frozen during start-up, under load, and killed outright), and the gateway, encoder
worker and generation worker alone (connecting, provisioning against a server whose
JetStream never answers, loading, serving, a supervised SGLang server starting).

Real processes, a real nats-server, real signals. Each stop time is printed (`-s`)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from shoal.queue.embedded import free_port, nats_server_binary
from tests.helpers import (
    GEN_MODEL,
    MODEL,
    ShoalProcess,
    cache_env,
    shoal_env,
    start_gateway,
    start_worker,
    wait_ready,
    wait_until,
)

pytestmark = pytest.mark.slow

STOP_WITHIN = 10.0
DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "sglang_server.py"


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def stop_and_time(pid: int, sig: int, what: str) -> float:
    """Send `sig` to `pid`; seconds until it and every process under it (as they were
    when signalled) are gone. Fails past STOP_WITHIN, naming what is left."""
    procs = tree(pid)
    started = time.monotonic()
    os.kill(pid, sig)
    _, alive = psutil.wait_procs(procs, timeout=STOP_WITHIN)
    took = time.monotonic() - started
    left = [" ".join(p.cmdline()[:4]) for p in alive if p.is_running()]
    for p in alive:
        p.kill()
    assert not left, f"{what}: still running {STOP_WITHIN}s after {sig!r}: {left}"
    print(f"\nstop time: {what}: {took:.2f}s")
    return took


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise TimeoutError(f"{what} not seen within {timeout}s")


def child_running(pid: int, word: str) -> bool:
    try:
        return any(word in " ".join(c.cmdline()) for c in psutil.Process(pid).children(True))
    except psutil.Error:
        return False


class NoJetStream:
    """A real nats-server without JetStream: connections work, every JetStream request
    goes unanswered (as while a cluster has no meta leader), so provisioning retries."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [str(nats_server_binary()), "--addr", "127.0.0.1", "--port", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._listening, 15, "nats-server listening")

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def no_jetstream() -> Iterator[NoJetStream]:
    server = NoJetStream()
    try:
        yield server
    finally:
        server.stop()


def nobody_listening() -> str:
    return f"nats://127.0.0.1:{free_port()}"


def in_log(proc: ShoalProcess, text: str) -> bool:
    return text in proc.log_path.read_text(errors="replace")


INFO = {"SHOAL_LOG_LEVEL": "info", "SHOAL_NATS__READY_WITHIN": "600"}


# Each process alone ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gateway", "encode", "generate"])
def test_a_process_connecting_to_nats_that_is_not_there_stops(tmp_path, kind) -> None:
    env = shoal_env(nobody_listening(), tmp_path, INFO)
    args = (
        ["gateway", "--port", str(free_port())] if kind == "gateway" else ["worker", "--kind", kind]
    )
    proc = ShoalProcess(args, env, tmp_path / f"{kind}.log")
    try:
        wait_until(lambda: in_log(proc, "not ready yet"), 60, proc, "connect retries")
        stop_and_time(proc.pid, signal.SIGTERM, f"{kind}, connecting")
    finally:
        proc.stop(signal.SIGKILL)


@pytest.mark.parametrize("kind", ["gateway", "encode", "generate"])
def test_a_process_provisioning_while_jetstream_does_not_answer_stops(
    tmp_path, no_jetstream, kind
) -> None:
    env = shoal_env(no_jetstream.url, tmp_path, INFO)
    args = (
        ["gateway", "--port", str(free_port())] if kind == "gateway" else ["worker", "--kind", kind]
    )
    proc = ShoalProcess(args, env, tmp_path / f"{kind}.log")
    try:
        # The retries of creating a bucket, stream or consumer (the reported hang).
        wait_until(lambda: in_log(proc, "not ready yet"), 60, proc, "provisioning retries")
        assert in_log(proc, "bucket") or in_log(proc, "stream") or in_log(proc, "consumer")
        stop_and_time(proc.pid, signal.SIGTERM, f"{kind}, provisioning")
    finally:
        proc.stop(signal.SIGKILL)


def test_a_generation_worker_converting_its_model_stops(nats_server, tmp_path) -> None:
    """A cold cache of its own: SmolLM2's GGUF is converted first (tens of seconds)."""
    cold = INFO | {"SHOAL_CACHE_DIR": str(tmp_path / "cache")}
    proc = start_worker(nats_server.url, tmp_path, GEN_MODEL, cold, "gen", "generate")
    try:
        wait_until(lambda: in_log(proc, "to safetensors"), 120, proc, "the conversion")
        time.sleep(1.0)
        assert not list((tmp_path / "cache" / "gguf").glob("*/.complete"))  # still loading
        stop_and_time(proc.pid, signal.SIGTERM, "generation worker, converting the model")
    finally:
        proc.stop(signal.SIGKILL)


def test_serving_workers_and_gateway_stop(nats_server, tmp_path, lm_dir) -> None:
    encoder = start_worker(nats_server.url, tmp_path, MODEL, INFO, "enc")
    generator = start_worker(nats_server.url, tmp_path, GEN_MODEL, INFO, "gen", "generate")
    gateway, base = start_gateway(nats_server.url, tmp_path, INFO)
    try:
        wait_ready(base, encoder)
        wait_until(lambda: in_log(generator, " ready: "), 120, generator, "generation worker")
        with Load(base):
            for proc, what in ((gateway, "gateway"), (generator, "generation worker"),
                               (encoder, "encoder worker")):  # fmt: skip
                stop_and_time(proc.pid, signal.SIGTERM, f"{what}, serving under load")
                assert proc.process.wait() == 0, proc.log()
    finally:
        for proc in (gateway, generator, encoder):
            proc.stop(signal.SIGKILL)


def test_a_generation_worker_whose_sglang_server_is_starting_stops_both(
    nats_server, tmp_path, lm_dir
) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(lm_dir, model_dir, ignore=shutil.ignore_patterns("*.safetensors"))
    spec = tmp_path / "models.toml"
    spec.write_text(
        '[[models]]\nid = "sglang-double"\ntasks = ["generate"]\nruntime = "sglang"\n'
        f'source = "{model_dir}"\nmax_length = 2048\n'
    )
    env = {
        **INFO,
        "SHOAL_MODELS_FILE": str(spec),
        "SHOAL_GENERATOR__SGLANG_COMMAND": f"{sys.executable},{DOUBLE}",
        # A server that takes ten minutes to load its model.
        "SHOAL_GENERATOR__SGLANG_ARGS": "--double-start-seconds,600",
    }
    proc = start_worker(nats_server.url, tmp_path, "sglang-double", env, "gen", "generate")
    try:
        wait_for(lambda: child_running(proc.pid, "sglang_server"), 60, "the SGLang server")
        time.sleep(1.0)
        stop_and_time(proc.pid, signal.SIGTERM, "generation worker, SGLang server starting")
    finally:
        proc.stop(signal.SIGKILL)


# shoal serve ---------------------------------------------------------------------------


class Serve:
    """`shoal serve` on a fresh data dir, its output in a log; with a cold model cache of
    its own unless `warm` (the session's shared one)."""

    def __init__(self, tmp_path: Path, warm: bool = False) -> None:
        self.port = free_port()
        self.data = tmp_path / "data"
        self.log_path = tmp_path / "serve.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
        env.update({"SHOAL_DATA_DIR": str(self.data), "SHOAL_LOG_LEVEL": "info"})
        env.update(cache_env() if warm else {})
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shoal", "serve", "--port", str(self.port)],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.base = f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def has_child(self, word: str) -> bool:
        return child_running(self.process.pid, word)

    def close(self) -> None:
        for p in psutil.Process(self.process.pid).children(True) if self.alive() else []:
            p.kill()
        if self.alive():
            self.process.kill()
        self.process.wait()
        self._log.close()

    def alive(self) -> bool:
        return self.process.poll() is None


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    s = Serve(tmp_path)
    try:
        yield s
    finally:
        s.close()


def test_serve_stopped_before_nats_is_up(serve: Serve) -> None:
    wait_for(lambda: serve.has_child("nats-server"), 60, "nats-server started")
    stop_and_time(serve.process.pid, signal.SIGINT, "serve, NATS starting")
    assert serve.process.wait() == 0, serve.log()


def test_serve_stopped_while_models_load(serve: Serve) -> None:
    wait_for(lambda: "to safetensors" in serve.log(), 120, "the generation model converting")
    time.sleep(1.0)
    stop_and_time(serve.process.pid, signal.SIGINT, "serve, models loading")
    assert serve.process.wait() == 0, serve.log()


def test_serve_stopped_while_its_nats_is_frozen_during_start_up(serve: Serve) -> None:
    """NATS stops answering (SIGSTOP) as soon as it listens: the workers and gateway are
    stuck connecting or provisioning when the stop comes."""
    wait_for(lambda: "NATS nats://" in serve.log() or "shoal: gateway" in serve.log(), 60,
             "serve past its NATS start")  # fmt: skip
    [nats] = [c for c in psutil.Process(serve.process.pid).children() if "nats-server" in c.name()]
    nats.suspend()
    try:
        wait_for(lambda: serve.has_child("gateway") and serve.has_child("worker"), 30, "children")
        time.sleep(4.0)
        stop_and_time(serve.process.pid, signal.SIGINT, "serve, NATS frozen while starting")
    finally:
        if nats.is_running():
            nats.kill()


def test_serve_killed_outright_takes_its_children_with_it(serve: Serve) -> None:
    """SIGKILL reaches only `serve`; its children get SIGTERM from the kernel
    (PR_SET_PDEATHSIG) and must stop in whatever phase they are (here: loading)."""
    wait_for(lambda: "to safetensors" in serve.log(), 120, "the generation model converting")
    procs = tree(serve.process.pid)
    started = time.monotonic()
    serve.process.kill()
    _, alive = psutil.wait_procs(procs, timeout=STOP_WITHIN)
    assert not alive, f"orphans: {[' '.join(p.cmdline()[:4]) for p in alive]}"
    print(f"\nstop time: serve SIGKILLed, children loading: {time.monotonic() - started:.2f}s")


def test_serve_stopped_under_load(tmp_path: Path, lm_dir) -> None:
    serve = Serve(tmp_path, warm=True)  # `lm_dir` first: the session's converted SmolLM2
    try:
        _stopped_under_load(serve)
    finally:
        serve.close()


def _stopped_under_load(serve: Serve) -> None:
    wait_ready(serve.base, timeout=180)
    with Load(serve.base) as load:
        wait_for(lambda: load.answered > 10, 60, "answers under load")
        stop_and_time(serve.process.pid, signal.SIGINT, "serve, under load")
    assert serve.process.wait() == 0, serve.log()
    assert load.hung == 0  # every request in flight got an answer or an error


class Load:
    """Embedding requests from 4 threads until closed (bounded: at most 2 minutes)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.answered = self.failed = self.hung = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(4)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def _run(self) -> None:
        body = {"model": MODEL, "input": ["a sentence about fish"] * 8}
        deadline = time.monotonic() + 120
        with httpx.Client(timeout=20) as http:
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    ok = http.post(f"{self.base}/v1/embeddings", json=body).status_code == 200
                    self.answered += ok
                    self.failed += not ok
                except httpx.TimeoutException:
                    self.hung += 1
                except httpx.HTTPError:
                    self.failed += 1  # refused: the server is gone
