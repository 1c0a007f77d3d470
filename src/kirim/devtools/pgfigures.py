"""What a ``kirim bench`` run cost the PostgreSQL server: WAL bytes and HOT updates.

``snapshot`` reads, on the bench's throw-away database, the server's WAL position and
the update counters of kirim's three hot tables; ``figures`` turns two snapshots
(before and after the deliveries) into WAL bytes per delivery and the share of
updates that were HOT (heap-only: no index entry written) per table.

The WAL position is the server's: on a server that others use, the WAL bytes include
theirs. The table counters are this database's own. A backend flushes its counters
when it goes idle (at most once a second) and when it exits, before it leaves
``pg_stat_activity``; so ``snapshot`` first waits until no other session is connected
to the database (the workers have closed theirs), then reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

TABLES = ("kirim_deliveries", "kirim_jobs", "kirim_attempts")


@dataclass(frozen=True)
class Snapshot:
    """The server's WAL position (bytes) and, per table, (updates, HOT updates)."""

    wal: int
    updates: dict[str, tuple[int, int]]


def _wait_alone(conn: Any, timeout: float) -> None:
    """Until no other session is connected to this database (or ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
        if row is None or row[0] == 0:
            return
        time.sleep(0.05)


def snapshot(url: str, timeout: float = 10.0) -> Snapshot:
    """The WAL position and the update counters of ``TABLES``, once every other
    session of the database has gone (their counters flushed)."""
    import psycopg

    from kirim.store.postgres import postgres_conninfo

    conninfo, _ = postgres_conninfo(url)
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
        _wait_alone(conn, timeout)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = conn.execute(
            "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relname = ANY(%s)",
            [list(TABLES)],
        ).fetchall()
        wal = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')").fetchone()
    updates = {str(name): (int(upd), int(hot)) for name, upd, hot in rows}
    return Snapshot(wal=int(wal[0]) if wal else 0, updates=updates)


def figures(before: Snapshot, after: Snapshot, delivered: int) -> dict[str, Any]:
    """WAL bytes per delivery (server-wide) and, per table, the updates per delivery
    made between the snapshots and the share of them that were HOT (None where there
    were none): flat keys, ``hot_ratio_kirim_jobs`` and the like."""
    out: dict[str, Any] = {
        "wal_bytes_per_delivery": round((after.wal - before.wal) / delivered, 1)
        if delivered
        else None,
        "wal_scope": "server-wide: other databases' writes on the server count too",
    }
    for table in TABLES:
        upd0, hot0 = before.updates.get(table, (0, 0))
        upd1, hot1 = after.updates.get(table, (0, 0))
        made = upd1 - upd0
        out[f"updates_per_delivery_{table}"] = round(made / delivered, 2) if delivered else None
        out[f"hot_ratio_{table}"] = round((hot1 - hot0) / made, 3) if made > 0 else None
    return out
