"""Shared fixtures: real SQLite files (and, when available, a real PostgreSQL)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from backends import BACKENDS, backend_url
from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.model import OnUnknown
from kirim.observe.logging import configure
from kirim.testing import FlakyProvider, ManualClock

configure(level="warning")


class _Edges(logging.Handler):
    """Keeps the changes of status the store wrote that kirim.machine's table lacks."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.unknown: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        d = record.__dict__
        if record.getMessage() == "unknown_edge":
            self.unknown.append(f"{d['source']} -> {d['target']} (delivery {d['delivery_id']})")
        elif record.getMessage() == "unknown_run_edge":  # kirim.runs.EDGES
            self.unknown.append(f"{d['source']} -> {d['target']} (run {d['run_id']})")


@pytest.fixture(autouse=True)
def edges_known() -> Iterator[_Edges]:
    """Every test fails when the store wrote a change of status that is not an edge of
    kirim.machine.EDGES (the table and the code cannot drift apart)."""
    handler = _Edges()
    loggers = [logging.getLogger("kirim.machine"), logging.getLogger("kirim.runs")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert not handler.unknown, f"not an edge of kirim.machine.EDGES: {handler.unknown}"


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of each backend (tests/backends.py)."""
    return backend_url(request, tmp_path)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


AppFactory = Callable[..., Awaitable[Kirim]]


@pytest.fixture
async def make_app(database_url: str, clock: ManualClock) -> AsyncIterator[AppFactory]:
    """Open apps on the same database (each with its own connection, like a process)."""
    apps: list[Kirim] = []

    async def make(
        provider: FlakyProvider | None = None,
        *,
        on_unknown: OnUnknown = OnUnknown.ASSUME_SENT,
        lookup: bool = False,
        max_attempts: int = 8,
        channel: str = "push",
    ) -> Kirim:
        channels = {
            channel: Channel(
                name=channel,
                provider=provider or FlakyProvider(),
                on_unknown=on_unknown,
                lookup=lookup,
            )
        }
        app = Kirim(
            Config(database=database_url, max_attempts=max_attempts),
            channels=channels,
            clock=clock,
        )
        await app.open(migrate=True)
        apps.append(app)
        return app

    yield make
    for app in apps:
        await app.close()
