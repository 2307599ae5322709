"""Dead letters through a real gateway: an item whose workers keep dying ends in the
dead-letter stream, its client gets a clear error well before the deadline, and the admin
route lists it. (Poison that raises in a real forward pass: tests/integration.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai
import pytest

from shoal.config import Settings
from shoal.queue import Bus, Subjects
from shoal.queue.embedded import EmbeddedNats
from shoal.queue.provision import ensure_consumer
from tests.helpers import MODEL, start_gateway
from tests.openai_schema import validate

pytestmark = pytest.mark.slow


async def test_an_item_its_workers_die_on_is_listed_as_a_dead_letter(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    env = {
        "SHOAL_NATS__MAX_DELIVER": "2",
        "SHOAL_NATS__ACK_WAIT": "1",
        "SHOAL_GATEWAY__NO_WORKER_POLICY": "queue",
        "SHOAL_GATEWAY__REQUEST_TIMEOUT": "60",
    }
    gateway, base = start_gateway(nats_server.url, tmp_path, env)
    settings = Settings()
    settings.nats.url, settings.nats.max_deliver, settings.nats.ack_wait = nats_server.url, 2, 1
    bus = await Bus.connect(settings.nats, "dying-worker")
    try:
        subjects = Subjects(settings.nats.subject_prefix)
        consumer = await ensure_consumer(bus, settings.nats, subjects, "interactive", MODEL)
        dying = await bus.puller(settings.nats.stream, consumer)
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        call = asyncio.create_task(client.embeddings.create(model=MODEL, input="kills workers"))
        for _ in range(2):  # a worker takes it and dies without settling it, twice
            assert len(await dying.fetch(1, 10.0)) == 1
        assert await dying.fetch(1, 2.0) == []
        with pytest.raises(openai.InternalServerError) as caught:
            await asyncio.wait_for(call, 30)
        body = caught.value.response.json()
        validate(body, "ErrorResponse")
        assert "dead letter" in body["error"]["message"]
        async with httpx.AsyncClient(base_url=base) as http:
            listed = (await http.get("/admin/v1/dead-letters", params={"model": MODEL})).json()
            assert (
                await http.get("/admin/v1/dead-letters", params={"limit": 0})
            ).status_code == 400
            other = (await http.get("/admin/v1/dead-letters", params={"model": "x"})).json()
        assert other["data"] == []
        (letter,) = listed["data"]
        assert letter["model"] == MODEL and letter["op"] == "embed"
        assert (letter["reason"], letter["deliveries"]) == ("worker_crashed", 2)
        assert letter["item_bytes"] > 0 and letter["request_id"]
        await dying.close()
    finally:
        await bus.close()
        gateway.stop()
