"""The gateway keeps the process's log handler (shoal/logs.py): building the Litestar
app must not put Litestar's own logging config on the root logger, whose queue thread
loses the lines written just before a last-resort exit and whose level and format are
not the ones the operator set."""

from __future__ import annotations

import logging
import logging.handlers
from collections.abc import Iterator

import pytest

from shoal.api.app import create_app
from shoal.config import Settings
from shoal.logs import configure_logging


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_the_gateway_app_leaves_the_process_log_handler_and_level(
    root_logging: logging.Logger,
) -> None:
    configure_logging("warning")
    ours = root_logging.handlers[:]

    create_app(Settings())

    assert root_logging.handlers == ours
    assert root_logging.level == logging.WARNING
    assert not any(
        isinstance(h, logging.handlers.QueueHandler)
        for h in logging.getLogger("shoal").handlers + root_logging.handlers
    )
