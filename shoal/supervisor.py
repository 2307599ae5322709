"""`shoal serve`: the whole system on one machine, as child processes.

Starts a local nats-server (JetStream, loopback, data in the data dir; it takes only a
password made for this start, which the children read from their private settings file),
one encoder worker, one generation worker and the gateway, each in its own session so
that Ctrl-C reaches only this supervisor, which then stops them in order, within `STOP_WITHIN`
seconds in all: gateways (no new requests; those in flight get the drain time), workers
(they finish or return what they hold), nats-server; whatever is still there at the end
is killed. A signal while it is still starting (nats-server coming up, a cluster
electing) stops the start at once. Children are tied to the supervisor's life with
PR_SET_PDEATHSIG, so even a killed supervisor leaves no orphans.

A `Topology` asks for more: several encoder workers, several gateways (on consecutive
ports) and a 3-node NATS cluster with every stream replicated three times: the shape of
a cluster deployment, on one machine, without containers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import msgspec

from .config import Settings
from .lifecycle import DRAIN_SECONDS, STOP_WITHIN, Stopped, die_with_parent
from .private import private_dir, write_private
from .queue.embedded import EmbeddedNats, EmbeddedNatsCluster, ServerAuth
from .queue.nats import wait_jetstream

__all__ = ["Child", "Topology", "serve"]

log = logging.getLogger("shoal.serve")


class Child:
    """`python -m shoal <args>` in its own session, stopped with the process that made it."""

    def __init__(self, name: str, args: list[str], log_path: Path | None) -> None:
        self.name = name
        out = open(log_path, "ab") if log_path else None  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shoal", *args],
            start_new_session=True,
            preexec_fn=die_with_parent,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def terminate(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGTERM)

    def wait_or_kill(self, until: float) -> None:
        """Wait for it to exit until `until` (monotonic time); then kill it."""
        try:
            self.process.wait(max(0.0, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in time; killing it", self.name)
            self.process.kill()
            self.process.wait()

    def stop(self, timeout: float) -> None:
        self.terminate()
        self.wait_or_kill(time.monotonic() + timeout)


def _stop_in_order(children: list[Child], started: float) -> None:
    """Gateways first (requests in flight get the drain time), then workers, each group
    signalled at once; everything is gone `STOP_WITHIN` - 1 seconds after `started`."""
    gateways = [c for c in children if c.name.startswith("gateway")]
    others = [c for c in children if c not in gateways]
    last = started + STOP_WITHIN - 1.0
    for group, until in ((gateways, min(last, time.monotonic() + DRAIN_SECONDS + 1.5)),
                         (others, last)):  # fmt: skip
        for child in group:
            child.terminate()
        for child in group:
            child.wait_or_kill(until)


@dataclass(frozen=True)
class Topology:
    """How many of each process `serve` runs."""

    workers: int = 1
    """Encoder workers, all pulling from the same consumers."""
    gateways: int = 1
    """Gateways, on the settings' port and the ports after it."""
    nats_nodes: int = 1
    """1: one nats-server; 3 (or more): a cluster, streams replicated three times."""

    def __post_init__(self) -> None:
        if self.workers < 1 or self.gateways < 1:
            raise ValueError("--workers and --gateways must be at least 1")
        if self.nats_nodes < 1 or self.nats_nodes == 2:
            raise ValueError("--nats-nodes must be 1 or at least 3 (a JetStream quorum)")


def _start_nats(
    data_dir: Path, run_dir: Path, nodes: int, settings: Settings
) -> EmbeddedNats | EmbeddedNatsCluster:
    """The local nats-server(s), up and (a cluster) electing, accepting only a user made
    for this start (other local users reach loopback too); stopped again if the start is
    interrupted. `settings.nats` then names the server(s) and that user."""
    auth = ServerAuth.generate()
    if nodes == 1:
        server = EmbeddedNats(data_dir / "nats", auth=auth)
        try:
            server.start(log_file=run_dir / "nats-server.log", preexec_fn=die_with_parent)
        except BaseException:
            server.kill()
            raise
        settings.nats = server.client_settings(settings.nats)
        return server
    cluster = EmbeddedNatsCluster(data_dir / "nats-cluster", size=nodes, auth=auth)
    try:
        cluster.start(log_dir=run_dir, preexec_fn=die_with_parent)
        settings.nats = cluster.client_settings(settings.nats)
        asyncio.run(wait_jetstream(settings.nats, within=60.0))
    except BaseException:
        cluster.stop(timeout=1.0)
        raise
    return cluster


def _fit_to_topology(settings: Settings, topology: Topology) -> None:
    if topology.nats_nodes > 1:
        settings.nats.replicas = max(settings.nats.replicas, 3)
    if topology.workers > 1 and not settings.worker.threads:
        # Workers on one machine share its cores: each takes its part, not all of them.
        settings.worker.threads = max(1, (os.cpu_count() or 1) // topology.workers)


def _children(config: Path, settings: Settings, topology: Topology) -> list[Child]:
    """Workers first, gateways last: `serve` stops them in the reverse order."""
    children = [
        Child(f"worker-{i}", ["worker", "--config", str(config)], None)
        for i in range(topology.workers)
    ]
    if settings.serve_generation:
        children.append(
            Child("generator", ["worker", "--kind", "generate", "--config", str(config)], None)
        )
    port = settings.gateway.port
    children += [
        Child(f"gateway-{i}", ["gateway", "--config", str(config), "--port", str(port + i)], None)
        for i in range(topology.gateways)
    ]
    return children


class ReadyWatch:
    """Says in the log when the gateway is ready and for which models, as each more comes
    (a generation model's first start exports it: a minute or more after the encoders),
    and which of the models `expected` at start are still loading. Asks `/ready` at most
    once a second, and only for `watch_s` after the start."""

    def __init__(self, base: str, expected: Collection[str] = (), watch_s: float = 900.0) -> None:
        self._url = f"{base}/ready"
        self._base = base
        self._expected = set(expected)
        self._until = time.monotonic() + watch_s
        self._next = 0.0
        self._models: set[str] = set()

    def poll(self) -> None:
        now = time.monotonic()
        if now < self._next or now > self._until:
            return
        self._next = now + 1.0
        try:  # urllib, not httpx: httpx logs every request at info, once a second here
            with urllib.request.urlopen(self._url, timeout=0.5) as answer:
                models = set(msgspec.json.decode(answer.read())["ready_models"])
        except (OSError, ValueError, KeyError, TypeError):
            return  # not listening yet, or not ready (503 is an HTTPError, an OSError)
        if models - self._models:
            self._models |= models
            loading = sorted(self._expected - self._models)
            log.info(
                "shoal: ready on %s: %s (API docs %s/docs, status %s/status)%s",
                self._base, ", ".join(sorted(self._models)), self._base, self._base,
                f"; still loading: {', '.join(loading)}" if loading else "",
            )  # fmt: skip


def loaded_at_start(settings: Settings) -> list[str]:
    """The models `serve`'s workers load before they are ready: the encoder worker's
    pinned ones and every generation model (others load on their first request)."""
    from .model_registry import ModelRegistry

    try:
        registry = ModelRegistry.from_files(*settings.spec_files)
    except Exception:  # the workers will say what is wrong with the spec
        return []
    return sorted(
        spec.id
        for spec in registry
        if (settings.serve_generation and settings.generator.serves(spec.id, spec.tasks))
        or (spec.id in settings.worker.pinned and settings.worker.serves(spec.id, spec.tasks))
    )


def serve(settings: Settings, topology: Topology | None = None) -> int:
    """Run until SIGINT/SIGTERM or until a child dies; returns the exit status."""
    topology = topology or Topology()
    data_dir = Path(settings.data_dir)
    run_dir = data_dir / "run"
    # The data dir holds the settings the children read (S3 secrets, `OTEL_*` headers,
    # the NATS password) and the queue's files.
    private_dir(data_dir)
    private_dir(run_dir)
    starting = True
    stop_asked_at = 0.0

    def _stop(signum: int, _frame: object) -> None:
        nonlocal stop_asked_at
        if stop_asked_at:
            return  # already stopping, within its bound
        stop_asked_at = time.monotonic()
        log.info("%s: stopping", signal.Signals(signum).name)
        if starting:  # break out of the blocking start (a child it made dies with us)
            raise Stopped()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)

    nats: EmbeddedNats | EmbeddedNatsCluster | None = None
    children: list[Child] = []
    status = 0
    try:
        if settings.demo:  # before the children, which read its spec
            from .demo import DemoBuildError, ensure_demo_models

            try:
                ensure_demo_models(data_dir)
            except DemoBuildError as exc:
                log.error("%s", exc)
                return 1
        nats = _start_nats(data_dir, run_dir, topology.nats_nodes, settings)
        _fit_to_topology(settings, topology)
        config = write_private(run_dir / "settings.json", msgspec.json.encode(settings))
        children += _children(config, settings, topology)
        starting = False
        g = settings.gateway
        generation = ", a generation worker" if settings.serve_generation else ""
        log.info(
            "shoal: %s on http://%s:%s (NATS %s, %d encoder worker(s)%s, data in %s); Ctrl-C stops",
            "gateway" if topology.gateways == 1 else "gateways",
            g.host,
            ",".join(str(g.port + i) for i in range(topology.gateways)),
            nats.url,
            topology.workers,
            generation,
            data_dir,
        )
        local = "127.0.0.1" if g.host in ("0.0.0.0", "::", "") else g.host
        local = f"[{local}]" if ":" in local else local
        ready = ReadyWatch(f"http://{local}:{g.port}", loaded_at_start(settings))
        while not stop_asked_at:
            dead = [c for c in children if not c.alive()]
            if dead:
                log.error("%s exited with %s; stopping", dead[0].name, dead[0].process.returncode)
                status = 1
                break
            ready.poll()
            time.sleep(0.2)
    except Stopped:
        log.info("shoal: stopped while starting")
    finally:
        starting = False
        _stop_in_order(children, stop_asked_at or time.monotonic())
        if nats is not None:
            nats.stop(timeout=1.0)
        log.info("shoal: stopped")
    return status
