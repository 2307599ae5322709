"""What the OpenVINO runtime (openvino.py) and its pipeline's process (openvino_host.py)
say to each other: msgspec Structs tagged by type, as MessagePack over a
`multiprocessing` pipe, one writer each way.

To the host: `Add` a sequence, `Cancel` one, `Stop`. From the host: `Ready` once loaded
(`Notice`s before it say why the draft pipeline did not load), or `Failed`; after each
round of steps one `Stepped`; `Refused` for a request the pipeline would not take; `Failed`
when a step raised (every sequence is dropped).
"""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Any, Literal

import msgspec

__all__ = [
    "Add",
    "Cancel",
    "Failed",
    "FromHost",
    "Notice",
    "Ready",
    "Refused",
    "SequenceStep",
    "Stepped",
    "Stop",
    "ToHost",
    "receive_from_host",
    "receive_in_host",
    "send",
]


class Add(msgspec.Struct, tag="add", array_like=True):
    rid: int
    prompt_ids: list[int]
    fields: dict[str, Any]
    """The sequence's GenerationConfig, as attributes to set."""
    may_assist: bool
    """The draft pipeline may decode it while it runs alone."""


class Cancel(msgspec.Struct, tag="cancel", array_like=True):
    rid: int


class Stop(msgspec.Struct, tag="stop", array_like=True):
    pass


ToHost = Add | Cancel | Stop


class Ready(msgspec.Struct, tag="ready", array_like=True):
    assisted: bool
    """The draft pipeline loaded too."""


class Notice(msgspec.Struct, tag="notice", array_like=True):
    message: str


class Failed(msgspec.Struct, tag="failed", array_like=True):
    message: str


class SequenceStep(msgspec.Struct, array_like=True):
    rid: int
    tokens: list[int]
    logprobs: list[float]
    state: Literal["running", "done", "ignored"]


class Stepped(msgspec.Struct, tag="step", array_like=True):
    sequences: list[SequenceStep]
    drafted: int
    """Sequences sent to the draft pipeline since the last `Stepped` (counts, not totals:
    a restarted process starts from zero and the runtime's totals go on)."""
    moved: int
    """Sequences moved from the draft pipeline to the main one since the last `Stepped`."""


class Refused(msgspec.Struct, tag="refused", array_like=True):
    rid: int
    message: str


FromHost = Ready | Notice | Failed | Stepped | Refused

_encoder = msgspec.msgpack.Encoder()
_to_host = msgspec.msgpack.Decoder(ToHost)
_from_host = msgspec.msgpack.Decoder(FromHost)


def send(conn: Connection | Any, message: ToHost | FromHost) -> None:
    """Raises OSError or ValueError once the other end is gone."""
    conn.send_bytes(_encoder.encode(message))


def receive_in_host(conn: Connection) -> ToHost:
    """Raises EOFError once the runtime is gone."""
    return _to_host.decode(conn.recv_bytes())


def receive_from_host(conn: Connection | Any) -> FromHost:
    """Raises EOFError (or OSError) once the host is gone."""
    return _from_host.decode(conn.recv_bytes())
