"""What one migration costs a populated PostgreSQL ledger: its statements' time and how
long a client of the ledger waits meanwhile.

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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
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


def _client(conninfo: str, stop: threading.Event, rounds: list[float]) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        n = 0
        while not stop.is_set():
            n += 1
            started = time.perf_counter()
            conn.execute(
                "INSERT INTO kirim_attempts (delivery_id, job_id, number, provider_request_id,"
                " worker_id, status, requested_at) VALUES (1, 1, 1, %s, 'probe', 'requested', 1)",
                [f"probe-{n}"],
            )
            conn.execute("UPDATE kirim_jobs SET updated_at = updated_at + 1 WHERE id = 2")
            conn.execute("SELECT * FROM kirim_deliveries WHERE id = 3").fetchall()
            rounds.append(time.perf_counter() - started)
            time.sleep(0.005)


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
        rounds: list[float] = []
        stop = threading.Event()
        client = threading.Thread(target=_client, args=(conninfo, stop, rounds))
        client.start()
        time.sleep(1.0)
        timed = []
        with psycopg.connect(conninfo) as conn:
            started = time.perf_counter()
            for statement in _statements(sql):
                t = time.perf_counter()
                conn.execute(statement.encode())
                timed.append([statement.splitlines()[0][:70], round(time.perf_counter() - t, 4)])
            t = time.perf_counter()
            conn.commit()
            commit_s = time.perf_counter() - t
            total_s = time.perf_counter() - started
        time.sleep(1.0)
        stop.set()
        client.join()
    return {
        "migration": name,
        "deliveries": deliveries,
        "ledger_size": size[0] if size else None,
        "fill_seconds": round(fill_s, 1),
        "statements_seconds": timed,
        "commit_seconds": round(commit_s, 4),
        "migration_seconds": round(total_s, 4),
        "client_rounds": len(rounds),
        "client_round_median_seconds": round(statistics.median(rounds), 4) if rounds else None,
        "client_round_max_seconds": round(max(rounds), 4) if rounds else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", required=True, help="postgresql:// URL of a server")
    parser.add_argument("--migration", type=int, default=18)
    parser.add_argument("--deliveries", type=int, default=1_000_000)
    args = parser.parse_args()
    print(json.dumps(measure(args.database, args.migration, args.deliveries)))


if __name__ == "__main__":
    main()
