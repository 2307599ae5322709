"""The OpenVINO runtime's messages to and from its pipeline's process, over a real pipe."""

from __future__ import annotations

import multiprocessing

import msgspec
import pytest

from shoal.workers.generation.openvino_protocol import (
    Add,
    Cancel,
    Failed,
    Notice,
    Ready,
    Refused,
    SequenceStep,
    Stepped,
    Stop,
    receive_from_host,
    receive_in_host,
    send,
)

TO_HOST = [
    Add(7, [1, 2, 3], {"max_new_tokens": 5, "rng_seed": 2**63 - 1, "json_schema": "{}"}, True),
    Cancel(7),
    Stop(),
]
FROM_HOST = [
    Ready(True),
    Notice("no speculative decoding: ..."),
    Failed("RuntimeError: boom"),
    Stepped([SequenceStep(7, [42, 43], [-0.5, -1.25], "running")], drafted=1, moved=0),
    Refused(7, "too long"),
]


def test_every_message_crosses_the_pipe_unchanged() -> None:
    runtime_end, host_end = multiprocessing.Pipe()
    for message in TO_HOST:
        send(runtime_end, message)
        assert receive_in_host(host_end) == message
    for message in FROM_HOST:
        send(host_end, message)
        assert receive_from_host(runtime_end) == message


def test_a_message_for_the_other_direction_or_a_bad_state_is_refused() -> None:
    runtime_end, host_end = multiprocessing.Pipe()
    send(host_end, Ready(False))
    with pytest.raises(msgspec.ValidationError):
        receive_in_host(runtime_end)
    host_end.send_bytes(msgspec.msgpack.encode(["step", [[1, [2], [], "paused"]], 0, 0]))
    with pytest.raises(msgspec.ValidationError):
        receive_from_host(runtime_end)


def test_a_closed_pipe_reads_as_the_end() -> None:
    runtime_end, host_end = multiprocessing.Pipe()
    host_end.close()
    with pytest.raises(EOFError):
        receive_from_host(runtime_end)
