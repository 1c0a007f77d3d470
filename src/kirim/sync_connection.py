"""A caller's sync ``psycopg.Connection`` seen as the async connection kirim's
PostgreSQL intake writes on (``SyncKirim``'s ``connection=``).

Every statement runs on the caller's connection, blocking, inside the caller's open
transaction, as sync code expects: nothing is committed here. What the intake uses
of an async connection is here, and only that: cursors (with their row factory and
their connection, which the pipelined statements of a digest or a throttle reach
through) and pipelines.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any


def async_view(connection: Any) -> Any:
    """A sync ``psycopg.Connection`` as an async one (``SyncConnection``); anything else
    (None, an async connection) as it is."""
    if connection is None:
        return None
    try:
        import psycopg
    except ImportError:  # then it is no psycopg connection
        return connection
    if isinstance(connection, psycopg.Connection):
        return SyncConnection(connection)
    return connection


class SyncConnection:
    """The async face of a sync connection."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def cursor(self, **kwargs: Any) -> SyncCursor:
        return SyncCursor(self._conn.cursor(**kwargs), self)

    @contextlib.asynccontextmanager
    async def pipeline(self) -> AsyncIterator[SyncPipeline]:
        with self._conn.pipeline() as pipeline:
            yield SyncPipeline(pipeline)


class SyncPipeline:
    def __init__(self, pipeline: Any) -> None:
        self._pipeline = pipeline

    async def sync(self) -> None:
        self._pipeline.sync()


class SyncCursor:
    """A sync cursor with awaitable methods; usable with and without ``async with``."""

    def __init__(self, cur: Any, connection: SyncConnection) -> None:
        self._cur = cur
        self.connection = connection

    async def __aenter__(self) -> SyncCursor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._cur.close()

    @property
    def row_factory(self) -> Any:
        return self._cur.row_factory

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> SyncCursor:
        self._cur.execute(query, params, **kwargs)
        return self

    async def executemany(self, query: Any, params: Any, **kwargs: Any) -> None:
        self._cur.executemany(query, params, **kwargs)

    async def fetchall(self) -> Any:
        return self._cur.fetchall()

    async def fetchone(self) -> Any:
        return self._cur.fetchone()

    @property
    def rowcount(self) -> int:
        return int(self._cur.rowcount)

    @property
    def description(self) -> Any:
        return self._cur.description
