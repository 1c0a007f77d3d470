"""The SQLite backend: one file, WAL, ``BEGIN IMMEDIATE`` for every write."""

from __future__ import annotations

from kirim.store.sqlite.driver import Q
from kirim.store.sqlite.store import SQLiteStore, _statements, connect_read_only, sqlite_path

__all__ = ["Q", "SQLiteStore", "_statements", "connect_read_only", "sqlite_path"]
