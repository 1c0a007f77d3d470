"""The SQLite driver: one file, WAL, ``BEGIN IMMEDIATE`` for every write."""

from __future__ import annotations

from kirim.store.base import StoreTime
from kirim.store.sql import SQLStore
from kirim.store.sqlite.driver import (
    Q,
    SQLiteDriver,
    _statements,
    connect_read_only,
    sqlite_path,
)


class SQLiteStore(SQLStore):
    """The embedded store (``sqlite:///kirim.db``): ``SQLStore`` on a ``SQLiteDriver``."""

    driver: SQLiteDriver

    def __init__(
        self,
        url: str,
        *,
        busy_timeout: float = 30.0,
        time: StoreTime = None,
        read_only: bool = False,
    ) -> None:
        """``time``: the time of record (``StoreTime``); None takes each caller's ``now``.
        ``read_only``: open an existing file for reading only (never create or change it)."""
        super().__init__(
            SQLiteDriver(url, busy_timeout=busy_timeout, time=time, read_only=read_only)
        )

    @property
    def path(self) -> str:
        return self.driver.path


__all__ = ["Q", "SQLiteDriver", "SQLiteStore", "_statements", "connect_read_only", "sqlite_path"]
