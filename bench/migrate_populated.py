"""What one migration costs a populated ledger: its statements' time and how long a
client of the ledger waits meanwhile.

``python bench/migrate_populated.py --database postgresql://… [--migration 18]
[--deliveries 1000000]`` makes a throw-away database (dropped after) at the schema
before the migration (the SQL files as written), fills it with ``--deliveries`` sent
deliveries, their jobs and attempts (``retention_bench.POSTGRES_FILL``, then ``VACUUM
ANALYZE``), and applies the migration's SQL in one transaction, statement by
statement, timing each and the commit. Meanwhile a client on its own connection (the
ledger's traffic) runs, every 5 ms, one round of three autocommit statements on the
tables a ledger migration locks: an attempt inserted, a job updated, a delivery read;
the script reports the longest round and the rounds' median. Prints one JSON object.
The statements' exclusive locks are held from the first that takes one to the commit:
what the client's longest round shows.

Without ``--database`` the ledger is a temporary SQLite file, filled the same way
(``retention_bench.SQLITE_FILL``), and the migration is applied by kirim's own runner
(``SQLiteDriver.migrate``: one ``BEGIN IMMEDIATE`` transaction, the schema cookie
bumped and the file checked after a schema edit); the client's round waits for the
database's write lock meanwhile (``busy_timeout``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from kirim.devtools.bench import scratch
from kirim.store.sqlfiles import load_queries, migration_files


def _statements(sql: str) -> list[str]:
    """The migration's statements (none of the ledger's migrations has a ``;`` inside a
    statement other than a function body, which this bench does not split)."""
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def _rounds(conn: Any, mark: str, stop: threading.Event, rounds: list[float]) -> None:
    """Every 5 ms until ``stop``: an attempt inserted, a job updated and a delivery read
    on ``conn`` (autocommit; ``mark``: the driver's placeholder), each round timed."""
    n = 0
    while not stop.is_set():
        n += 1
        started = time.perf_counter()
        conn.execute(
            "INSERT INTO kirim_attempts (delivery_id, job_id, number, provider_request_id,"
            f" worker_id, status, requested_at) VALUES (1, 1, 1, {mark}, 'probe', 'requested', 1)",
            [f"probe-{n}"],
        )
        conn.execute("UPDATE kirim_jobs SET updated_at = updated_at + 1 WHERE id = 2")
        conn.execute("SELECT * FROM kirim_deliveries WHERE id = 3").fetchall()
        rounds.append(time.perf_counter() - started)
        time.sleep(0.005)


def _client(conninfo: str, stop: threading.Event, rounds: list[float]) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        _rounds(conn, "%s", stop, rounds)


def _sqlite_client(path: str, stop: threading.Event, rounds: list[float]) -> None:
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None, timeout=60.0)
    try:
        _rounds(conn, "?", stop, rounds)
    finally:
        conn.close()


@contextmanager
def _probing(client: Any, target: str) -> Iterator[list[float]]:
    """``client`` (``_client`` or ``_sqlite_client``) on ``target`` in a thread from a
    second before the block to a second after it; its rounds' times."""
    rounds: list[float] = []
    stop = threading.Event()
    thread = threading.Thread(target=client, args=(target, stop, rounds))
    thread.start()
    time.sleep(1.0)
    try:
        yield rounds
    finally:
        time.sleep(1.0)
        stop.set()
        thread.join()


def _figures(rounds: list[float]) -> dict[str, Any]:
    """The client's rounds: how many, their median and their longest."""
    return {
        "client_rounds": len(rounds),
        "client_round_median_seconds": round(statistics.median(rounds), 4) if rounds else None,
        "client_round_max_seconds": round(max(rounds), 4) if rounds else None,
    }


def measure_sqlite(migration: int, deliveries: int) -> dict[str, Any]:
    """The SQLite twin of ``measure``: the migration through kirim's runner."""
    import asyncio
    import sqlite3

    from retention_bench import fill

    from kirim.store.sqlite.driver import SQLiteDriver, _reload_schema
    from kirim.store.sqlite.driver import _statements as sqlite_statements

    files = {version: (name, sql) for version, name, sql in migration_files("sqlite")}
    name = files[migration][0]
    with tempfile.TemporaryDirectory(prefix="kirim-mig-") as tmp:
        path = str(Path(tmp) / "ledger.db")
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(load_queries("sqlite")["create_meta"])
        for version in sorted(v for v in files if v < migration):
            conn.execute("BEGIN IMMEDIATE")
            for statement in sqlite_statements(files[version][1]):
                conn.execute(statement)
            if "writable_schema" in files[version][1]:
                _reload_schema(conn)
            conn.execute("COMMIT")
        conn.execute(
            "INSERT INTO kirim_meta (key, value) VALUES ('schema_version', ?)",
            [str(migration - 1)],
        )
        conn.close()
        fill_s = fill(f"sqlite:///{path}", deliveries)
        size = Path(path).stat().st_size
        with _probing(_sqlite_client, path) as rounds:
            driver = SQLiteDriver(f"sqlite:///{path}")
            started = time.perf_counter()
            reached = asyncio.run(_migrate_sqlite(driver))
            total_s = time.perf_counter() - started
    return {
        "migration": name,
        "schema_version": reached,
        "deliveries": deliveries,
        "ledger_size": f"{size / 2**20:.0f} MB",
        "fill_seconds": round(fill_s, 1),
        "migration_seconds": round(total_s, 4),
        **_figures(rounds),
    }


async def _migrate_sqlite(driver: Any) -> int:
    await driver.open()
    try:
        return int(await driver.migrate())
    finally:
        await driver.close()


def measure(database: str, migration: int, deliveries: int) -> dict[str, Any]:
    import psycopg
    from retention_bench import fill

    from kirim.store.postgres import postgres_conninfo

    files = {version: (name, sql) for version, name, sql in migration_files("postgres")}
    name, sql = files[migration]
    with (
        tempfile.TemporaryDirectory(prefix="kirim-mig-") as tmp,
        scratch(database, Path(tmp)) as url,
    ):
        conninfo, _ = postgres_conninfo(url)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(load_queries("postgres")["create_meta"].encode())
            for version in sorted(v for v in files if v < migration):
                conn.execute(files[version][1].encode())
        fill_s = fill(url, deliveries)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            size = conn.execute(
                "SELECT pg_size_pretty(sum(pg_total_relation_size(c.oid))) FROM pg_class c"
                " WHERE relname IN ('kirim_deliveries', 'kirim_jobs', 'kirim_attempts')"
            ).fetchone()
        timed = []
        with _probing(_client, conninfo) as rounds, psycopg.connect(conninfo) as conn:
            started = time.perf_counter()
            for statement in _statements(sql):
                t = time.perf_counter()
                conn.execute(statement.encode())
                timed.append([statement.splitlines()[0][:70], round(time.perf_counter() - t, 4)])
            t = time.perf_counter()
            conn.commit()
            commit_s = time.perf_counter() - t
            total_s = time.perf_counter() - started
    return {
        "migration": name,
        "deliveries": deliveries,
        "ledger_size": size[0] if size else None,
        "fill_seconds": round(fill_s, 1),
        "statements_seconds": timed,
        "commit_seconds": round(commit_s, 4),
        "migration_seconds": round(total_s, 4),
        **_figures(rounds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database", help="postgresql:// URL of a server (without it: a SQLite file)"
    )
    parser.add_argument("--migration", type=int, default=18)
    parser.add_argument("--deliveries", type=int, default=1_000_000)
    args = parser.parse_args()
    if args.database:
        print(json.dumps(measure(args.database, args.migration, args.deliveries)))
    else:
        print(json.dumps(measure_sqlite(args.migration, args.deliveries)))


if __name__ == "__main__":
    main()
