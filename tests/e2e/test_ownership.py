"""Files and batches belong to the API key that made them, through the official openai SDK
against a real gateway with keys (on the shared stack's NATS and workers): another key
gets exactly the 404 of an id that does not exist on every route, never sees them in a
list, pages through its own; an admin key sees everything; a gateway restarted between
create and read keeps every owner."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from pathlib import Path

import msgspec
import openai
import pytest

from shoal.api.keys import hash_key
from shoal.compat.openai.files import FileObject
from shoal.config import NatsSettings
from shoal.queue import Bus
from shoal.queue.embedded import EmbeddedNats
from tests.e2e.test_batches import embed_lines, jsonl, output_lines, wait_batch
from tests.helpers import MODEL, ShoalProcess, hears_of, start_gateway, wait_until

pytestmark = pytest.mark.slow

KEYS = {
    "team-a": "sk-shoal-test-team-a-0123456789",
    "team-b": "sk-shoal-test-team-b-0123456789",
    "ops": "sk-shoal-test-ops-0123456789",
}
ENTRIES = [
    {"name": "team-a", "sha256": hash_key(KEYS["team-a"])},
    {"name": "team-b", "sha256": hash_key(KEYS["team-b"]), "routes": ["files", "batches"]},
    {"name": "ops", "sha256": hash_key(KEYS["ops"]), "admin": True},
]
FILES_BUCKET = "SHOAL_FILES_OWNED"


class Gateway:
    """One gateway with the three keys, restartable on the same data dir and buckets."""

    def __init__(self, nats_url: str, data: Path) -> None:
        self.nats_url = nats_url
        self.data = data
        self.env = {
            "SHOAL_AUTH__KEYS": json.dumps(ENTRIES),
            # Buckets of its own: the stack's gateway would otherwise run these batches
            # and list these files (it keeps objects in another data dir).
            "SHOAL_NATS__FILES_BUCKET": FILES_BUCKET,
            "SHOAL_NATS__BATCHES_BUCKET": "SHOAL_BATCHES_OWNED",
        }
        self.process: ShoalProcess | None = None
        self.base = ""
        self.start()

    def start(self) -> None:
        self.process, self.base = start_gateway(self.nats_url, self.data, self.env)
        wait_until(lambda: hears_of(self.base, MODEL), 60, self.process, f"{MODEL} heard of")

    def restart(self) -> None:
        """Stop (SIGTERM) and start again; a stop that failed still starts it again, so
        the module's later tests meet a gateway, then fails."""
        assert self.process is not None
        status, log = self.process.stop(), self.process.log()
        self.start()
        assert status == 0, log

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.base}/v1", api_key=KEYS[key], max_retries=0, timeout=60
        )


@pytest.fixture(scope="module")
def gateway(
    stack: str, session_nats: EmbeddedNats, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    gw = Gateway(session_nats.url, tmp_path_factory.mktemp("owned"))
    try:
        yield gw
    finally:
        if gw.process is not None:
            gw.process.stop()


def upload(oai: openai.OpenAI, name: str, lines: list[dict] | None = None) -> str:
    data = jsonl(lines or embed_lines(2, prefix=name))
    return oai.files.create(file=(f"{name}.jsonl", io.BytesIO(data)), purpose="batch").id


def not_found(call) -> dict:
    with pytest.raises(openai.NotFoundError) as caught:
        call()
    return caught.value.response.json()["error"]


def same_as_missing(call_with, real_id: str, missing_id: str) -> None:
    """`call_with(real_id)` answers exactly as `call_with(missing_id)` (an id that never
    existed), the id in the message aside: no existence oracle."""
    real = not_found(lambda: call_with(real_id))
    missing = not_found(lambda: call_with(missing_id))
    assert real == {**missing, "message": missing["message"].replace(missing_id, real_id)}


def own_pages(list_page, limit: int) -> list[str]:
    """Every id through `after` cursors, `limit` at a time, checking `has_more`."""
    ids: list[str] = []
    after = None
    for _ in range(100):
        page = list_page(limit=limit, after=after) if after else list_page(limit=limit)
        ids += [item.id for item in page.data]
        if not page.has_more:
            assert len(page.data) <= limit
            return ids
        assert len(page.data) == limit
        after = page.data[-1].id
    raise AssertionError("pagination did not end")


def test_files_belong_to_the_key_that_uploaded_them(gateway: Gateway) -> None:
    a, b, ops = gateway.client("team-a"), gateway.client("team-b"), gateway.client("ops")
    mine = [upload(a, f"a{i}") for i in range(3)]
    theirs = upload(b, "b0")
    missing = "file-00000000000000000000dead"

    for file_id in mine:
        same_as_missing(b.files.retrieve, file_id, missing)
        same_as_missing(lambda i: b.files.content(i).read(), file_id, missing)
        same_as_missing(b.files.delete, file_id, missing)
        assert a.files.retrieve(file_id).id == file_id  # the delete above changed nothing
    same_as_missing(a.files.retrieve, theirs, missing)

    a_ids = own_pages(a.files.list, limit=2)
    assert sorted(a_ids) == sorted(mine)
    assert own_pages(b.files.list, limit=2) == [theirs]
    every = {f.id for f in ops.files.list().data}
    assert set(mine) | {theirs} <= every
    assert b"a0-0" in ops.files.content(mine[0]).read()  # an admin reads any file

    assert b.files.delete(theirs).deleted
    assert a.files.delete(mine[2]).deleted
    assert ops.files.delete(mine[1]).deleted  # and deletes any
    assert own_pages(a.files.list, limit=1) == [mine[0]]


def test_batches_and_their_outputs_belong_to_the_key_that_created_them(
    gateway: Gateway,
) -> None:
    a, b, ops = gateway.client("team-a"), gateway.client("team-b"), gateway.client("ops")
    source = upload(a, "ab")
    # A batch may read only its own key's files: another's is as good as missing.
    with pytest.raises(openai.BadRequestError) as refused:
        b.batches.create(input_file_id=source, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.BadRequestError) as never:
        b.batches.create(
            input_file_id="file-00000000000000000000dead",
            endpoint="/v1/embeddings",
            completion_window="24h",
        )
    assert refused.value.response.json()["error"]["code"] == "file_not_found"
    assert never.value.response.json()["error"]["code"] == "file_not_found"

    batches = [
        a.batches.create(input_file_id=upload(a, f"ab{i}"), endpoint="/v1/embeddings",
                         completion_window="24h").id
        for i in range(3)
    ]  # fmt: skip
    theirs = b.batches.create(
        input_file_id=upload(b, "bb"), endpoint="/v1/embeddings", completion_window="24h"
    ).id
    missing = "batch_00000000000000000000dead"
    for batch_id in batches:
        same_as_missing(b.batches.retrieve, batch_id, missing)
        same_as_missing(b.batches.cancel, batch_id, missing)
    assert own_pages(a.batches.list, limit=2) == sorted(batches, reverse=True)
    assert own_pages(b.batches.list, limit=2) == [theirs]
    assert set(batches) | {theirs} <= {x.id for x in ops.batches.list(limit=100).data}

    done = wait_batch(a, batches[0], timeout=120)
    assert done.status == "completed", done
    output = done.output_file_id
    assert output is not None
    assert len(output_lines(a, output)) == 2
    same_as_missing(b.files.retrieve, output, "file-00000000000000000000dead")
    assert output not in own_pages(b.files.list, limit=5)
    assert output in own_pages(a.files.list, limit=5)
    assert len(output_lines(ops, output)) == 2
    assert ops.batches.retrieve(batches[0]).id == batches[0]
    try:  # an admin cancels any key's batch, unless it is already done
        assert ops.batches.cancel(theirs).status in ("cancelling", "cancelled")
    except openai.ConflictError:
        assert ops.batches.retrieve(theirs).status == "completed"


def test_owners_survive_a_gateway_restart(gateway: Gateway) -> None:
    a, b = gateway.client("team-a"), gateway.client("team-b")
    file_id = upload(a, "restart")
    batch_id = a.batches.create(
        input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h"
    ).id

    gateway.restart()

    a, b, ops = gateway.client("team-a"), gateway.client("team-b"), gateway.client("ops")
    assert a.files.retrieve(file_id).id == file_id
    assert a.batches.retrieve(batch_id).id == batch_id
    same_as_missing(b.files.retrieve, file_id, "file-00000000000000000000dead")
    same_as_missing(b.batches.retrieve, batch_id, "batch_00000000000000000000dead")
    assert ops.files.retrieve(file_id).id == file_id
    done = wait_batch(a, batch_id, timeout=120)
    assert done.status == "completed", done
    assert len(output_lines(a, done.output_file_id)) == 2


def test_a_file_stored_before_owners_were_recorded_is_for_admins_only(
    gateway: Gateway, session_nats: EmbeddedNats
) -> None:
    legacy = FileObject(
        id="file-legacy0000000000000001", bytes=0, created_at=1, filename="old.jsonl",
        purpose="batch",
    )  # fmt: skip

    async def store_as_before() -> None:
        bus = await Bus.connect(NatsSettings(url=session_nats.url), name="test-legacy")
        try:
            kv = await bus.key_value(FILES_BUCKET)
            await kv.put(legacy.id, msgspec.json.encode(legacy))  # no owner field at all
        finally:
            await bus.close()

    asyncio.run(store_as_before())
    a, ops = gateway.client("team-a"), gateway.client("ops")
    same_as_missing(a.files.retrieve, legacy.id, "file-00000000000000000000dead")
    assert legacy.id not in own_pages(a.files.list, limit=10)
    assert ops.files.retrieve(legacy.id).filename == "old.jsonl"
