"""What the PostgreSQL claim's statement would cost under a leaner protocol or schema:
server time and WAL per delivery, measured, not guessed (issue 24's redesign).

On a throw-away database of N pending deliveries (enqueued by the store, then VACUUM
ANALYZE), ``claim_fresh`` for a batch of 256 runs under ``EXPLAIN (ANALYZE, WAL)`` in a
transaction rolled back (so each run claims the same first batch), ``--runs`` times,
in two variants:

- ``both rows``: the statement as kirim sends it (the delivery and its job written);
- ``job only``: the delivery read, not written; the job leased with the claim's token
  (the lean ledger's "lease on the job row only": the protocol change it needs, the
  delivery's state derived from its job's, is not built; this measures its statement);

each on two schemas: kirim's own, and ``--no-status-indexes``: the jobs without the
four partial indexes that name ``status`` (one_active, due, leased, dead) and the due
jobs found by an index on ``(run_at, id)``, so that a claim's job update is HOT. That
schema is not a design (a due scan would walk the jobs in flight, and nothing would
find an expired lease or refuse a second active job): it bounds what a HOT job
update could save. Prints the median execution time per batch, per delivery, and the
WAL bytes per delivery of each. Asserts nothing.

    .venv/bin/python bench/claim_variants.py
    .venv/bin/python bench/claim_variants.py --no-status-indexes
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

BATCH = 256
NAME = "kirim_claim_variants"

#: the lean schema's bound: no index of the jobs names their status
NO_STATUS_INDEXES = (
    "DROP INDEX kirim_jobs_one_active, kirim_jobs_due, kirim_jobs_leased, kirim_jobs_dead",
    "CREATE INDEX kirim_jobs_due ON kirim_jobs (run_at, id)",
    "ALTER TABLE kirim_jobs SET (fillfactor = 40)",
    "VACUUM FULL kirim_jobs",
)


def job_only(claim_fresh: str) -> str:
    """``claim_fresh`` with its delivery read, not written: the job is leased under a
    token made in the statement, as the delivery's update made it."""
    head = claim_fresh[: claim_fresh.index("d AS (")]
    return (
        head
        + """d AS (
    SELECT d.*, replace(gen_random_uuid()::text, '-', '') AS token,
           kirim_now(%(now)s::float8) + %(lease)s::float8 AS until,
           kirim_now(%(now)s::float8) AS at,
           '{queued,retry_scheduled}'::text[] AS due_states
    FROM kirim_deliveries d
    WHERE d.id = ANY (ARRAY(SELECT delivery_id FROM due))
      AND d.status = 'pending'
      AND (d.type IS NULL OR d.type <> ALL (%(checked_types)s::text[]))
      AND (SELECT a.id FROM kirim_attempts a WHERE a.delivery_id = d.id LIMIT 1) IS NULL
),
j AS (
    UPDATE kirim_jobs j
    SET status = 'running', attempts = j.attempts + 1, lease_owner = %(worker_id)s,
        lease_token = d.token, lease_expires_at = d.until, updated_at = d.at
    FROM d
    WHERE j.delivery_id = d.id AND j.status = ANY (d.due_states)
    RETURNING d.*, j.id AS job_id
)
SELECT * FROM j;"""
    )


async def measure(url: str, deliveries: int, runs: int, lean: bool) -> list[dict[str, Any]]:
    import psycopg
    from fresh_db import enqueue_plain, fresh_ledger

    from kirim.store.postgres import PostgresStore
    from kirim.store.sqlfiles import load_queries

    db = await fresh_ledger(url, NAME)
    store = PostgresStore(db)
    await store.open()
    try:
        await enqueue_plain(store, deliveries)
    finally:
        await store.close()
    queries = load_queries("postgres")
    variants = {
        "both rows": queries["claim_fresh"],
        "job only": job_only(queries["claim_fresh"]),
    }
    args = {"now": 1001.0, "limit": BATCH, "lease": 600.0, "worker_id": "w", "checked_types": []}
    out = []
    try:
        async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
            for sql in NO_STATUS_INDEXES if lean else ():
                await conn.execute(sql.encode())
            await conn.execute(b"VACUUM ANALYZE")
            for name, sql in variants.items():
                times, wal = [], []
                for _ in range(runs):
                    async with conn.transaction(force_rollback=True):
                        # the transaction's settings, as the driver sends them
                        await conn.execute(queries["no_jit"].encode())
                        await conn.execute(queries["plan_by_index"].encode())
                        cur = await conn.execute(
                            ("EXPLAIN (ANALYZE, WAL, FORMAT JSON) " + sql).encode(), args
                        )
                        [[plan]] = await cur.fetchall()
                    times.append(plan[0]["Execution Time"])
                    wal.append(plan[0]["Plan"].get("WAL Bytes", 0))
                ms = statistics.median(times)
                out.append(
                    {
                        "schema": "no status indexes" if lean else "kirim's",
                        "variant": name,
                        "ms_per_batch": round(ms, 2),
                        "us_per_delivery": round(ms / BATCH * 1000, 1),
                        "wal_bytes_per_delivery": round(statistics.median(wal) / BATCH),
                    }
                )
    finally:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            await admin.execute(f"DROP DATABASE IF EXISTS {NAME} WITH (FORCE)".encode())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--deliveries", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--no-status-indexes", action="store_true")
    args = parser.parse_args()
    import json

    lean = args.no_status_indexes
    for row in asyncio.run(measure(args.database, args.deliveries, args.runs, lean)):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
