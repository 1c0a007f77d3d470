"""The PostgreSQL backend: psycopg 3 async on a connection pool, for many worker hosts."""

from __future__ import annotations

from kirim.store.postgres.connect import postgres_conninfo
from kirim.store.postgres.store import PostgresStore
from kirim.text import redact_url as redact

__all__ = ["PostgresStore", "postgres_conninfo", "redact"]
