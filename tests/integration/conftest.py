"""The integration tests' harness: a real nats-server, an in-process gateway dispatcher
and encoder workers with the dummy adapter (tests/integration/test_queue_semantics.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.test_queue_semantics import Harness, RecordingStore, settings_for


@pytest.fixture
async def harness(nats_server, tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(settings_for(nats_server.url), RecordingStore(tmp_path / "objects"))
    await h.open()
    yield h
    await h.close()
