"""The PostgreSQL driver: psycopg 3 async on a connection pool, for many worker hosts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from kirim.model import EnqueueResult
from kirim.store import intake
from kirim.store.base import Intent, NewDelivery, StoreTime
from kirim.store.pooler import Wakeups
from kirim.store.postgres.connect import postgres_conninfo
from kirim.store.postgres.driver import PostgresDriver
from kirim.store.postgres.ledger import LedgerWatch
from kirim.store.sql import SQLStore
from kirim.text import redact_url as redact


class PostgresStore(SQLStore):
    """The shared store (``postgresql://user@host/db``): ``SQLStore`` on a
    ``PostgresDriver``, with its two capabilities: ``wait_for_jobs`` (LISTEN/NOTIFY
    wake-ups) and ``enqueue_in`` (enqueue inside the application's own transaction)."""

    driver: PostgresDriver

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        time: StoreTime = None,
        listen_url: str | None = None,
    ) -> None:
        """``time``: the time of record (``StoreTime``); None takes each caller's ``now``,
        "database" the server's clock (``kirim_now()`` in every statement).
        ``listen_url``: where to LISTEN for wake-ups (None: on ``url``), a direct
        connection when ``url`` goes through a pooler in transaction mode."""
        super().__init__(PostgresDriver(url, timeout=timeout, time=time, listen_url=listen_url))

    @property
    def wakeups(self) -> Wakeups:
        return self.driver.wakeups

    @property
    def ledger(self) -> LedgerWatch:
        return self.driver.ledger

    def committed(self, intents: Sequence[Intent], done: Sequence[bool]) -> None:
        self.driver.ledger.committed(intents, done)

    async def wait_for_jobs(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait until a job may have become claimable (an enqueue, a retry, a released
        or reaped lease, here or on any host): True when notified, False on timeout.

        Listens on a dedicated connection, kept between calls so that a notification
        that arrives while the caller is busy wakes the next call at once. When that
        connection was lost, the call that notices it (or the one that listens again)
        returns True: something may have been missed, so the caller should poll. While
        the database is unreachable it waits ``timeout`` and returns False.
        """
        return await self.driver.wait_for_jobs(timeout)

    async def enqueue_in(
        self, conn: psycopg.AsyncConnection[Any], items: Sequence[NewDelivery], *, now: float
    ) -> list[EnqueueResult]:
        """Enqueue inside the caller's open transaction on ``conn``; nothing is committed.

        The deliveries (and the workers' wake-up) exist when, and only if, the caller
        commits; a rollback leaves no trace.
        """
        return await self.driver.run_in(conn, intake.enqueue(items, now))


__all__ = ["PostgresDriver", "PostgresStore", "postgres_conninfo", "redact"]
