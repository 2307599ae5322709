"""`shoal serve`'s ready line: which models are ready, and which of those its workers load
at start are still loading (a fake gateway's `/ready` answers)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from shoal.config import Settings
from shoal.supervisor import ReadyWatch, loaded_at_start

READY: list[str] = []


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"status": "ok", "ready_models": READY}).encode()
        self.send_response(200 if READY else 503)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_ready_line_names_what_is_still_loading(gateway: str, caplog) -> None:
    caplog.set_level(logging.INFO, logger="shoal.serve")
    watch = ReadyWatch(gateway, ["all-MiniLM-L6-v2", "smollm2-135m-instruct"])

    def poll() -> list[str]:
        watch._next = 0.0  # as a second later
        caplog.clear()
        watch.poll()
        return [r.getMessage() for r in caplog.records]

    READY[:] = []
    assert poll() == []  # 503: not ready, nothing said
    READY[:] = ["all-MiniLM-L6-v2"]
    [line] = poll()
    assert line.startswith(f"shoal: ready on {gateway}: all-MiniLM-L6-v2 (API docs {gateway}/docs")
    assert line.endswith("; still loading: smollm2-135m-instruct")
    assert poll() == []  # nothing new, nothing said again
    READY[:] = ["all-MiniLM-L6-v2", "smollm2-135m-instruct"]
    [line] = poll()
    assert "all-MiniLM-L6-v2, smollm2-135m-instruct" in line and "still loading" not in line


def test_the_models_loaded_at_start_are_the_pinned_and_the_generation_ones() -> None:
    settings = Settings()
    assert loaded_at_start(settings) == ["all-MiniLM-L6-v2", "smollm2-135m-instruct"]
    settings.serve_generation = False
    settings.worker.pinned = []
    assert loaded_at_start(settings) == []
