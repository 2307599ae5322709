"""Old and new processes read each other's wire messages (msgspec schema evolution)."""

from __future__ import annotations

import msgspec

from shoal.queue.messages import EmbedJob, EmbedResult, JobFailed, decode_job, decode_reply, encode


class OldEmbedJob(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="embed"):
    """EmbedJob as first released, before `first_index`."""

    request_id: str
    part: int
    model: str
    reply_to: str
    deadline: float
    texts: list[str] = []
    token_ids: list[list[int]] = []
    dimensions: int = 0
    truncate: bool = True
    dtype: str = "float32"


class NewerEmbedJob(OldEmbedJob, tag="embed"):
    first_index: int = 0
    priority: int = 0  # a field a later release might add


def test_a_new_decoder_reads_an_old_job() -> None:
    old = OldEmbedJob(request_id="r", part=1, model="m", reply_to="x", deadline=1.0, texts=["a"])
    job = decode_job(msgspec.msgpack.encode(old))
    assert isinstance(job, EmbedJob)
    assert job.texts == ["a"] and job.first_index == 0


def test_an_old_decoder_reads_a_newer_job() -> None:
    newer = NewerEmbedJob(
        request_id="r",
        part=0,
        model="m",
        reply_to="x",
        deadline=1.0,
        texts=["a"],
        first_index=5,
        priority=3,
    )
    old = msgspec.msgpack.decode(msgspec.msgpack.encode(newer), type=OldEmbedJob)
    assert old.texts == ["a"]
    assert decode_job(msgspec.msgpack.encode(newer)).first_index == 5


def test_replies_round_trip_and_are_told_apart_by_tag() -> None:
    result = EmbedResult(request_id="r", part=0, data=b"\x00" * 8, rows=1, dims=2)
    failure = JobFailed(request_id="r", part=1, code="invalid_input", message="no")
    assert decode_reply(encode(result)) == result
    assert decode_reply(encode(failure)) == failure
    # The failure's code is still "kind" on the wire: gateways and workers of the release
    # before the rename read it.
    assert msgspec.msgpack.decode(encode(failure))["kind"] == "invalid_input"
