"""`shoal serve --workers 3 --gateways 2 --nats-nodes 3`: a cluster deployment's shape on
one machine (a 3-node NATS cluster on loopback, two gateways, three encoder workers and a
generation worker). Traffic goes through both gateways; Ctrl-C takes all of it down."""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import nats
import nats.errors
import numpy as np
import openai
import psutil
import pytest

from shoal.queue.embedded import free_port
from tests.helpers import (
    GEN_MODEL,
    MODEL,
    Watched,
    cache_env,
    stop_with_ctrl_c,
    wait_ready,
    wait_until,
)
from tests.nats_cluster import stream_view

pytestmark = pytest.mark.slow

WORKERS = 3


def _two_free_ports() -> int:
    """A port whose next port is free too (the second gateway takes it)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


def _ready_workers(base: str) -> list[dict]:
    status = httpx.get(f"{base}/status.json", timeout=10).json()
    return [w for w in status["workers"] if w["state"] == "ready"]


def test_a_local_cluster_serves_through_both_gateways_and_stops_cleanly(tmp_path: Path) -> None:
    port = _two_free_ports()
    bases = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env.update(SHOAL_DATA_DIR=str(tmp_path / "data"), HF_HUB_OFFLINE="1", **cache_env())
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115
    serve = subprocess.Popen(
        [sys.executable, "-m", "shoal", "serve", "--port", str(port), "--workers",
         str(WORKERS), "--gateways", "2", "--nats-nodes", "3"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        watched = Watched(serve, tmp_path / "serve.log")
        for base in bases:
            wait_ready(base, watched, timeout=240)
        # The supervisor's own children: a worker's children (its OpenVINO host, a process
        # forked for a moment) are not workers.
        children = psutil.Process(serve.pid).children()
        commands = [" ".join(c.cmdline()) for c in children]
        assert sum("nats-server" in c for c in commands) == 3
        assert sum(" gateway " in c for c in commands) == 2
        assert sum(" worker " in c and "generate" not in c for c in commands) == WORKERS
        assert sum("--kind generate" in c for c in commands) == 1

        # Both gateways hear every worker's heartbeat through the cluster.
        for base in bases:
            wait_until(
                lambda b=base: len(_ready_workers(b)) >= WORKERS + 1, 240, watched, "workers"
            )

        # Streams and buckets are replicated on all three nodes, which take only the user
        # `serve` made for this start.
        settings = json.loads((tmp_path / "data" / "run" / "settings.json").read_bytes())
        nats_url = settings["nats"]["url"]
        login = {"user": settings["nats"]["user"], "password": settings["nats"]["password"]}
        assert len(nats_url.split(",")) == 3
        assert asyncio.run(stream_view(nats_url, "SHOAL_WORK", **login)).replicas == 3
        for node in nats_url.split(","):
            with pytest.raises(nats.errors.Error, match="Authorization Violation"):
                asyncio.run(nats.connect(node, allow_reconnect=False, connect_timeout=5))

        clients = [openai.OpenAI(base_url=f"{b}/v1", api_key="x", max_retries=0) for b in bases]
        texts = [f"sentence number {i} about the sea" for i in range(64)]

        def embed(i: int) -> np.ndarray:
            got = clients[i % 2].embeddings.create(model=MODEL, input=texts[i : i + 4])
            return np.array([d.embedding for d in got.data])

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(embed, range(0, 60)))
        # The same text gets the same vector whichever gateway and worker served it.
        for i in range(0, 56):
            np.testing.assert_allclose(answers[i][1], answers[i + 1][0], atol=1e-5)

        chat = clients[1].chat.completions.create(
            model=GEN_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert chat.choices[0].message.content

        # A file uploaded through one gateway is a batch on the other, and its result
        # can be read through either.
        lines = [
            {"custom_id": f"c{i}", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": MODEL, "input": texts[i]}}
            for i in range(20)
        ]  # fmt: skip
        data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        uploaded = clients[0].files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        batch = clients[1].batches.create(
            input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
        )
        wait_until(
            lambda: clients[0].batches.retrieve(batch.id).status == "completed",
            120,
            watched,
            "batch",
        )
        done = clients[1].batches.retrieve(batch.id)
        out = clients[0].files.content(done.output_file_id).text.splitlines()
        assert sorted(json.loads(line)["custom_id"] for line in out) == sorted(
            line["custom_id"] for line in lines
        )

        assert stop_with_ctrl_c(serve, children) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        log.close()
    assert b"stopped" in (tmp_path / "serve.log").read_bytes()
