"""What the finish of a batch costs: statements, transactions, time, CPU, and WAL on PostgreSQL.

``python bench/finish_bench.py [--database postgresql://…|sqlite:///…] [--notifications 5000]``
enqueues, claims (batches of 256) and writes the intents of the notifications on a
throw-away database (PostgreSQL: dropped after; without ``--database``, a temporary
SQLite file at ``synchronous=full``), then finishes each batch (every delivery sent by
its own success: the plain, common finish) and reports, for the finishes alone: the
statements sent per batch, the explicit transactions per batch, the wall time and the
process's CPU time per delivery (SQLite's: its driver's thread included), and on
PostgreSQL the WAL bytes per delivery (``pg_current_wal_lsn`` before and after:
server-wide, so the lowest of several runs is the closest to kirim's own). One JSON
object. Run it on two checkouts (``PYTHONPATH=<checkout>/src``) to compare them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

BATCH = 256


async def _batches(store: Any, notifications: int) -> list[list[Any]]:
    """Enqueue, claim and write the intents of ``notifications``; each claimed batch's
    finishes (sent by its own success)."""
    from fresh_db import enqueue_plain

    from kirim.model import AttemptStatus, DeliveryStatus
    from kirim.store.base import AttemptOutcome, Finish, Intent

    await enqueue_plain(store, notifications)
    batches = []
    while claims := await store.claim(worker_id="w", now=1001.0, lease=600.0, limit=BATCH):
        intents = [
            Intent(
                delivery_id=c.delivery.id,
                job_id=c.job.id,
                token=c.token,
                number=c.job.attempts,
                provider_request_id=f"r{c.delivery.id}",
                worker_id="w",
                requested_at=1001.0,
            )
            for c in claims
        ]
        await store.record_intents(intents)
        batches.append(
            [
                Finish(
                    delivery_id=c.delivery.id,
                    job_id=c.job.id,
                    token=c.token,
                    now=1002.0,
                    attempt=AttemptOutcome(
                        provider_request_id=f"r{c.delivery.id}",
                        status=AttemptStatus.SUCCEEDED,
                        provider_message_id=f"m{c.delivery.id}",
                        error=None,
                        completed_at=1002.0,
                    ),
                    delivery_status=DeliveryStatus.SENT,
                    provider_message_id=f"m{c.delivery.id}",
                )
                for c in claims
            ]
        )
    return batches


async def _finish_all(store: Any, batches: list[list[Any]]) -> tuple[float, float]:
    """Finish every batch: (wall seconds, process CPU seconds)."""
    started, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
        results = await store.finish(batch)
        assert all(r.committed for r in results)
    return time.perf_counter() - started, time.process_time() - cpu


def _figures(
    batches: list[list[Any]], statements: int, transactions: int, wall: float, cpu: float
) -> dict[str, Any]:
    done = sum(len(b) for b in batches)
    return {
        "deliveries": done,
        "batches": len(batches),
        "statements_per_batch": statements / len(batches),
        "transactions_per_batch": transactions / len(batches),
        "finish_us_per_delivery": round(wall / done * 1e6, 1),
        "finish_cpu_us_per_delivery": round(cpu / done * 1e6, 1),
    }


async def measure_sqlite(url: str, notifications: int) -> dict[str, Any]:
    from kirim.store.sqlite import SQLiteStore

    store = SQLiteStore(url)
    await store.open()
    try:
        await store.migrate()
        batches = await _batches(store, notifications)
        seen: list[str] = []
        conn = store.driver._conn
        await store.driver._call(lambda: conn.set_trace_callback(seen.append))
        wall, cpu = await _finish_all(store, batches)
        await store.driver._call(lambda: conn.set_trace_callback(None))
    finally:
        await store.close()
    words = [s.split()[0].upper() for s in seen]
    statements = sum(w not in ("BEGIN", "COMMIT", "ROLLBACK") for w in words)
    out = _figures(batches, statements, words.count("BEGIN"), wall, cpu)
    return {"database": "sqlite", **out}


async def measure(url: str, notifications: int) -> dict[str, Any]:
    import psycopg
    from fresh_db import fresh_ledger

    from kirim.store.postgres import PostgresStore

    db = await fresh_ledger(url, "kirim_finish_bench")
    store = PostgresStore(db)
    await store.open()
    batches = await _batches(store, notifications)
    statements = 0
    transactions = 0
    execute = psycopg.AsyncCursor.execute
    transaction = psycopg.AsyncConnection.transaction

    async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal statements
        statements += 1
        return await execute(self, *args, **kwargs)

    def counted_tx(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal transactions
        transactions += 1
        return transaction(self, *args, **kwargs)

    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
        lsn = (await (await conn.execute("SELECT pg_current_wal_lsn()")).fetchone())[0]
        psycopg.AsyncCursor.execute = counted  # type: ignore[method-assign]
        psycopg.AsyncConnection.transaction = counted_tx  # type: ignore[method-assign]
        try:
            wall, cpu = await _finish_all(store, batches)
        finally:
            psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]
            psycopg.AsyncConnection.transaction = transaction  # type: ignore[method-assign]
        cur = await conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn,))
        wal = float((await cur.fetchone())[0])
    await store.close()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        await admin.execute("DROP DATABASE IF EXISTS kirim_finish_bench")
    out = _figures(batches, statements, transactions, wall, cpu)
    return {
        "database": "postgresql",
        **out,
        "finish_wal_bytes_per_delivery": round(wal / out["deliveries"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database", help="a PostgreSQL server's URL, or a SQLite URL (default: a temporary file)"
    )
    parser.add_argument("--notifications", type=int, default=5000)
    args = parser.parse_args()
    if args.database and args.database.startswith("postgres"):
        print(json.dumps(asyncio.run(measure(args.database, args.notifications))))
        return
    with tempfile.TemporaryDirectory(prefix="kirim-finish-") as tmp:
        url = args.database or f"sqlite:///{tmp}/finish.db"
        print(json.dumps(asyncio.run(measure_sqlite(url, args.notifications))))


if __name__ == "__main__":
    main()
