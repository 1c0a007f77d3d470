"""The PostgreSQL driver: psycopg 3 async on a connection pool, for many worker hosts."""

from __future__ import annotations

from kirim.store.base import StoreTime
from kirim.store.pooler import Wakeups
from kirim.store.postgres.connect import postgres_conninfo
from kirim.store.postgres.driver import PostgresDriver
from kirim.store.postgres.ledger import LedgerWatch
from kirim.store.sql import SQLStore
from kirim.text import redact_url as redact


class PostgresStore(SQLStore):
    """The shared store (``postgresql://user@host/db``): ``SQLStore`` on a
    ``PostgresDriver``, which ``listens`` (LISTEN/NOTIFY wake-ups) and ``enqueues_in``
    (enqueue inside the application's own transaction)."""

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
        """Where LISTEN goes, and the routes the connections took."""
        return self.driver.wakeups

    @property
    def listen_conninfo(self) -> str:
        """Where a LISTEN goes (``listen_url``, else ``url``)."""
        return self.driver.listen_conninfo

    @property
    def ledger(self) -> LedgerWatch:
        """The intents committed lately, checked after a lost connection."""
        return self.driver.ledger


__all__ = ["PostgresDriver", "PostgresStore", "postgres_conninfo", "redact"]
