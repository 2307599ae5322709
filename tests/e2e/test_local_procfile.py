"""deploy/local/Procfile, run as its README says (honcho), on free ports: a 3-node NATS
cluster, two gateways and two encoder workers, in whatever order honcho starts them.
Traffic goes through both gateways; Ctrl-C stops every process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import openai
import psutil
import pytest

from shoal.queue.embedded import free_port
from tests.helpers import MODEL, Watched, stop_with_ctrl_c, wait_ready, wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROCFILE = ROOT / "deploy" / "local" / "Procfile"


def _env_file(path: Path, data_dir: Path) -> tuple[Path, list[str]]:
    """The shipped .env with every port replaced by a free one."""
    ports = {name: free_port() for name in (
        "NATS_PORT_0", "NATS_PORT_1", "NATS_PORT_2", "ROUTE_PORT_0", "ROUTE_PORT_1",
        "ROUTE_PORT_2", "GATEWAY_PORT_0", "GATEWAY_PORT_1",
    )}  # fmt: skip
    shipped = (PROCFILE.parent / ".env").read_text().splitlines()
    assert {line.split("=")[0] for line in shipped if "=" in line} >= set(ports)
    nats = ",".join(f"nats://127.0.0.1:{ports[f'NATS_PORT_{i}']}" for i in range(3))
    values = {
        **ports,
        "SHOAL_NATS__URL": nats,
        "SHOAL_DATA_DIR": data_dir,
        "SHOAL_WORKER__THREADS": 1,
    }
    lines = [
        f"{key}={values[key]}" if (key := line.split("=")[0]) in values else line
        for line in shipped
    ]
    path.write_text("\n".join(lines) + "\n")
    return path, [f"http://127.0.0.1:{ports[f'GATEWAY_PORT_{i}']}" for i in range(2)]


def test_the_procfile_cluster_serves_through_both_gateways(tmp_path: Path) -> None:
    env_file, bases = _env_file(tmp_path / "local.env", tmp_path / "data")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    log = tmp_path / "honcho.log"
    with open(log, "wb") as out:
        honcho = subprocess.Popen(
            [str(Path(sys.executable).parent / "honcho"), "-f", str(PROCFILE), "-e",
             str(env_file), "-d", str(ROOT), "start", "-c", "encoder=2",
             "nats0", "nats1", "nats2", "gateway0", "gateway1", "encoder"],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        watched = Watched(honcho, log)
        for base in bases:
            wait_ready(base, watched, timeout=240)
        children = psutil.Process(honcho.pid).children(recursive=True)
        for base in bases:
            wait_until(
                lambda b=base: sum(
                    w["state"] == "ready"
                    for w in httpx.get(f"{b}/status.json", timeout=10).json()["workers"]
                ) == 2,
                120, watched, "two encoder workers",
            )  # fmt: skip
        vectors = []
        for base in bases:
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
            got = client.embeddings.create(model=MODEL, input=["the same text", "another"])
            vectors.append(np.array([d.embedding for d in got.data]))
        np.testing.assert_allclose(vectors[0], vectors[1], atol=1e-5)
        assert (tmp_path / "data" / "nats" / "n2").is_dir()

        stop_with_ctrl_c(honcho, children, timeout=60)
    finally:
        if honcho.poll() is None:
            honcho.kill()
            honcho.wait()
