"""LISTEN/NOTIFY wake-ups for workers on the PostgreSQL backend.

Every transaction that makes a job claimable now (enqueue, operator retry, a
released or reaped lease) runs ``pg_notify('kirim_jobs', '')``; PostgreSQL delivers
it at commit, to every listening connection on any host.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import psycopg

CHANNEL = "kirim_jobs"


class Listener:
    """One dedicated connection that LISTENs on ``kirim_jobs``, opened on first use.

    It stays open between waits, so a notification that arrives while the worker is
    busy wakes its next wait at once.
    """

    def __init__(self, conninfo: str, *, connect_timeout: float) -> None:
        self.conninfo = conninfo
        self.connect_timeout = connect_timeout
        self._conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None
        self._lost = False  # the last connection broke: notifications may have been missed
        self._lock = asyncio.Lock()

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109
        """True when notified (or when notifications may have been missed), False after
        ``timeout`` seconds without one."""
        timeout = max(0.0, timeout)
        async with self._lock:
            started = time.monotonic()
            try:
                async with asyncio.timeout(self.connect_timeout):
                    conn, missed = await self._listening()
            except (psycopg.Error, TimeoutError):
                # The database is away: wait like a poll interval, then let the caller poll.
                await asyncio.sleep(max(0.0, timeout - (time.monotonic() - started)))
                return False
            if missed:
                return True
            try:
                woke = False
                async for _ in conn.notifies(timeout=timeout, stop_after=1):
                    woke = True
                if woke:  # one wake-up for every notification that has arrived
                    async for _ in conn.notifies(timeout=0):
                        pass
                return woke
            except psycopg.Error:
                await self._drop()
                return True

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def _listening(self) -> tuple[psycopg.AsyncConnection[tuple[object, ...]], bool]:
        """The listening connection, and whether it is new (notifications before it are
        unknown, so the caller should poll once)."""
        if self._conn is not None and (self._conn.closed or self._conn.broken):
            await self._drop()
        if self._conn is not None:
            return self._conn, False
        conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        try:
            await conn.execute(f"LISTEN {CHANNEL}")
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        # Whatever was notified before this LISTEN is unknown: the caller should poll.
        self._lost = False
        return conn, True

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._lost = True
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
