"""The gateway's connections against idle and slow clients (shoal/api/connections.py):
what sends nothing is closed, a head or body that trickles gets 408, and everyone else is
served meanwhile. uvicorn with the gateway's protocol, on raw sockets; the app is a small
echo (the deadlines are the protocol's, whatever the app)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from litestar import Litestar, Request, get, post
from litestar.response import Stream

from shoal.api.connections import guarded_protocol
from shoal.config import GatewaySettings
from tests.helpers import app_in_thread, raw_status

HEAD_S, BODY_S, MIN_RATE, WRITE_S = 1.0, 1.0, 1000, 1.0
STREAMED = {"chunks": 0, "ended": False}
"""What the streaming route sent, and whether its generator was closed."""


@post("/echo", status_code=200)
async def echo(request: Request) -> dict[str, int]:
    return {"bytes": len(await request.body())}


@get("/stream")
async def stream() -> Stream:
    """64 MiB in 64 KiB chunks, far more than the socket buffers hold, each awaited as a
    generation's tokens are."""

    async def chunks() -> AsyncIterator[bytes]:
        try:
            for _ in range(1024):
                await asyncio.sleep(0.001)
                STREAMED["chunks"] += 1
                yield b"x" * 65536
        finally:
            STREAMED["ended"] = True

    return Stream(chunks())


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    limits = GatewaySettings(
        head_timeout=HEAD_S, body_timeout=BODY_S, body_min_rate=MIN_RATE, write_timeout=WRITE_S
    )
    with app_in_thread(Litestar([echo, stream]), http=guarded_protocol(limits)) as free:
        yield free


def _connect(port: int) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    return conn


def _read_all(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def _trickle(conn: socket.socket, pieces: list[bytes], pause: float) -> None:
    """Send `pieces` with `pause` seconds between them, until the server cuts us off."""
    try:
        for piece in pieces:
            conn.sendall(piece)
            time.sleep(pause)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _post(body: bytes) -> bytes:
    head = f"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


def _timed_out(answer: bytes) -> None:
    assert raw_status(answer) == 408, answer
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_timeout" and error["type"] == "invalid_request_error"


def test_connections_that_send_nothing_are_closed_and_others_are_served(port: int) -> None:
    idle = [_connect(port) for _ in range(300)]
    try:
        started = time.monotonic()
        served = _connect(port)
        served.sendall(_post(b"hello"))
        assert b'{"bytes":5}' in served.recv(65536)  # while 300 others idle
        served.close()
        for conn in idle:
            assert _read_all(conn) == b""  # closed by the server, nothing said
        # Each after its head timeout, none long after.
        assert HEAD_S - 0.2 < time.monotonic() - started < HEAD_S + 5
    finally:
        for conn in idle:
            conn.close()


def test_a_head_sent_a_byte_at_a_time_gets_408(port: int) -> None:
    conn = _connect(port)
    started = time.monotonic()
    head = b"GET /echo HTTP/1.1\r\nhost: x\r\nx-slow: " + b"y" * 100
    # Each byte in time, the head as a whole not.
    _trickle(conn, [bytes([byte]) for byte in head], pause=0.05)
    _timed_out(_read_all(conn))
    assert time.monotonic() - started < HEAD_S + 5
    conn.close()


def test_a_body_that_trickles_gets_408(port: int) -> None:
    conn = _connect(port)
    started = time.monotonic()
    conn.sendall(_post(b"x" * 10_000)[:-10_000])
    _trickle(conn, [b"x" * 10] * 100, pause=0.1)  # 100 bytes/s, well below the minimum rate
    _timed_out(_read_all(conn))
    assert time.monotonic() - started < BODY_S + 5
    conn.close()


def test_a_large_body_on_a_slow_but_steady_link_passes(port: int) -> None:
    """Past `body_timeout`, but above the minimum rate all along: not a trickle."""
    body = b"x" * 60_000
    conn = _connect(port)
    started = time.monotonic()
    conn.sendall(_post(body)[: -len(body)])
    for i in range(0, len(body), 2_000):  # 20 kB/s for 3 s
        conn.sendall(body[i : i + 2_000])
        time.sleep(0.1)
    answer = conn.recv(65536)
    assert time.monotonic() - started > BODY_S
    assert raw_status(answer) == 200 and b'{"bytes":60000}' in answer, answer
    conn.close()


def test_a_kept_alive_connection_serves_request_after_request(port: int) -> None:
    conn = _connect(port)
    for _ in range(3):
        conn.sendall(_post(b"abc"))
        assert b'{"bytes":3}' in conn.recv(65536)
        time.sleep(HEAD_S / 2)  # within the next head's time
    conn.close()


def test_an_answer_left_unread_is_cut_off_and_its_stream_ends(port: int) -> None:
    conn = _connect(port)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    conn.sendall(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
    started = time.monotonic()
    while not STREAMED["ended"]:  # the client reads nothing
        assert time.monotonic() - started < WRITE_S + 10, STREAMED
        time.sleep(0.1)
    assert STREAMED["chunks"] < 1024  # stopped, not finished into the buffers
    conn.settimeout(10)
    received = 0
    try:
        while chunk := conn.recv(1 << 20):
            received += len(chunk)
    except ConnectionResetError:
        pass
    assert received < 1024 * 65536  # the connection ended short of the whole answer
    conn.close()
