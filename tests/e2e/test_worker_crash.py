"""A worker killed mid-load loses nothing: its unacked items go to the next worker."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from tests.helpers import start_gateway, start_worker, wait_ready

pytestmark = pytest.mark.slow


async def test_kill_9_mid_load_then_a_new_worker_answers_everything_once(
    nats_server, tmp_path, st_model, model_name
) -> None:
    fast_redelivery = {"SHOAL_NATS__ACK_WAIT": "3"}
    first = start_worker(nats_server.url, tmp_path, extra=fast_redelivery, name="first")
    gateway, base = start_gateway(
        nats_server.url,
        tmp_path,
        {
            "SHOAL_GATEWAY__NO_WORKER_POLICY": "queue",  # keep accepting while no worker is up
            "SHOAL_GATEWAY__REQUEST_TIMEOUT": "120",
        },
    )
    second = None
    try:
        wait_ready(base, first)
        texts = [
            [f"crash test {i} part {j} " + "pad " * (i % 30) for j in range(8)] for i in range(150)
        ]
        answers: dict[int, list] = {}

        async with httpx.AsyncClient(base_url=base, timeout=150) as client:

            async def one(i: int) -> None:
                r = await client.post(
                    "/v1/embeddings",
                    json={"model": model_name, "input": texts[i], "encoding_format": "float"},
                )
                assert r.status_code == 200, r.text
                answers.setdefault(i, []).append(r.json())

            tasks = [asyncio.create_task(one(i)) for i in range(len(texts))]
            await _until(lambda: len(answers) >= 10)
            first.kill()  # SIGKILL: no goodbye, no nak, items stay unacked
            answered_before = len(answers)
            assert answered_before < len(texts), "the worker finished before it was killed"
            second = start_worker(nats_server.url, tmp_path, extra=fast_redelivery, name="second")
            await asyncio.wait_for(asyncio.gather(*tasks), 240)

        assert sorted(answers) == list(range(len(texts)))
        assert all(len(v) == 1 for v in answers.values())
        flat = [t for group in texts for t in group]
        expected = st_model.encode(flat, batch_size=64).reshape(len(texts), 8, 384)
        for i, [body] in answers.items():
            got = np.array([d["embedding"] for d in body["data"]])
            assert (got * expected[i]).sum(1).min() > 0.9999
    finally:
        gateway.stop()
        first.stop()
        if second is not None:
            second.stop()


async def _until(check, timeout: float = 120.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline
        await asyncio.sleep(0.05)
