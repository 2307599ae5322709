"""The storage quota's accounting on one gateway, over a stand-in for the files bucket (a
dict the test records files in, as `FileStore.add` does once a file is stored): uploads in
flight count, so two at once cannot both take the last room, and an upload recorded while
another is in flight is counted for it."""

from __future__ import annotations

import asyncio

import pytest

from shoal.api.file_quota import StorageQuota, StorageQuotaError, StoredBytes
from shoal.api.uploads import receive_upload
from tests.unit.api.test_batch_lines import multipart_body


class Bucket:
    def __init__(self) -> None:
        self.files: list[tuple[str, int]] = []

    async def stored(self) -> StoredBytes:
        by_owner: dict[str, int] = {}
        for owner, size in self.files:
            by_owner[owner] = by_owner.get(owner, 0) + size
        return StoredBytes(by_owner, sum(by_owner.values()))


async def pieces(
    sizes: list[int], sent: asyncio.Event | None = None, go: asyncio.Event | None = None
):
    """Chunks of `sizes`; after the first is taken (and so counted), `sent` is set and the
    rest wait for `go`."""
    for i, size in enumerate(sizes):
        if i and sent is not None and go is not None:
            sent.set()
            await go.wait()
        yield b"x" * size


async def store(quota: StorageQuota, bucket: Bucket, owner: str, chunks) -> int:
    """What the upload route does: meter the chunks, record the file once stored."""
    async with quota.upload(owner) as metered:
        size = sum([len(c) async for c in metered(chunks)])
        bucket.files.append((owner, size))
        return size


async def test_a_key_is_refused_past_its_quota_and_other_keys_do_not_count() -> None:
    bucket = Bucket()
    quota = StorageQuota(per_key=100, total=1000, stored=bucket.stored)
    assert await store(quota, bucket, "a", pieces([60])) == 60
    assert await store(quota, bucket, "b", pieces([90])) == 90  # b's own 100
    with pytest.raises(StorageQuotaError) as caught:
        await store(quota, bucket, "a", pieces([20, 30]))
    error = caught.value
    assert (error.status_code, error.code, error.param) == (413, "storage_quota_exceeded", "file")
    assert "'a'" in error.message and "60" in error.message
    assert bucket.files == [("a", 60), ("b", 90)]  # the refused file was not recorded
    assert await store(quota, bucket, "a", pieces([40])) == 40  # exactly the room left
    with pytest.raises(StorageQuotaError):
        await quota.check_room("a")  # full: no batch (its output would be stored too)
    await quota.check_room("b")


async def test_the_total_quota_counts_every_key() -> None:
    bucket = Bucket()
    quota = StorageQuota(per_key=100, total=150, stored=bucket.stored)
    await store(quota, bucket, "a", pieces([100]))
    with pytest.raises(StorageQuotaError) as caught:
        await store(quota, bucket, "b", pieces([30, 30]))
    assert "total" in caught.value.message
    assert "'a'" not in caught.value.message  # another key's usage is not told
    with pytest.raises(StorageQuotaError):
        await store(quota, bucket, "c", pieces([51]))
    await store(quota, bucket, "c", pieces([50]))
    with pytest.raises(StorageQuotaError):
        await quota.check_room("c")


async def test_uploads_in_flight_at_once_share_the_room_left() -> None:
    bucket = Bucket()
    quota = StorageQuota(per_key=100, total=1000, stored=bucket.stored)
    sent_one, sent_two, go = asyncio.Event(), asyncio.Event(), asyncio.Event()
    # Both send 40 and wait; then each sends 20 more: 120 in all, one must be refused.
    one = asyncio.create_task(store(quota, bucket, "a", pieces([40, 20], sent_one, go)))
    two = asyncio.create_task(store(quota, bucket, "a", pieces([40, 20], sent_two, go)))
    await sent_one.wait()
    await sent_two.wait()  # both have read the (empty) bucket and sent 40
    go.set()
    results = await asyncio.gather(one, two, return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["StorageQuotaError", "int"]
    assert bucket.files == [("a", 60)]


async def test_an_upload_recorded_meanwhile_counts_for_one_still_in_flight() -> None:
    bucket = Bucket()
    quota = StorageQuota(per_key=100, total=1000, stored=bucket.stored)
    sent, go = asyncio.Event(), asyncio.Event()
    slow = asyncio.create_task(store(quota, bucket, "a", pieces([10, 41], sent, go)))
    await sent.wait()  # it read the bucket (empty) and sent 10
    assert await store(quota, bucket, "a", pieces([50])) == 50  # recorded
    go.set()
    with pytest.raises(StorageQuotaError):
        await slow  # 10 + 41 + the 50 recorded since it read the bucket: past 100
    assert bucket.files == [("a", 50)]


async def test_an_upload_past_the_room_stops_reading_the_body() -> None:
    """Refused as soon as the file passes the room left: the rest of a 10 MB body is
    never read, let alone stored."""
    bucket = Bucket()
    quota = StorageQuota(per_key=100_000, total=1 << 30, stored=bucket.stored)
    body = multipart_body([("purpose", None, b"batch"), ("file", "big", b"x" * 10_000_000)])
    read = 0

    async def stream():
        nonlocal read
        for start in range(0, len(body), 4096):
            read += 4096
            yield body[start : start + 4096]

    async def store_file(filename: str, chunks) -> int:
        return await store(quota, bucket, "a", chunks)

    with pytest.raises(StorageQuotaError):
        await receive_upload(
            stream(), "multipart/form-data; boundary=BOUND", store_file, 1 << 30, {}
        )
    assert read <= 100_000 + 2 * 4096
    assert bucket.files == []
