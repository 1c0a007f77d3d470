"""What the finish of a batch costs PostgreSQL: statements, transactions, time, WAL.

``python bench/finish_bench.py --database postgresql://… [--notifications 5000]``
enqueues, claims (batches of 256) and writes the intents of the notifications on a
throw-away database (dropped after), then finishes each batch (every delivery sent
by its own success: the plain, common finish) and reports, for the finishes alone:
the named statements sent per batch, the explicit transactions per batch, the wall
time per delivery, and the WAL bytes per delivery (``pg_current_wal_lsn`` before and
after: server-wide, so the lowest of several runs is the closest to kirim's own).
One JSON object. Run it on two checkouts (``PYTHONPATH=<checkout>/src``) to compare
them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

BATCH = 256


async def measure(url: str, notifications: int) -> dict[str, Any]:
    import psycopg
    from fresh_db import fresh_postgres

    from kirim.keys import canonical_json, payload_hash
    from kirim.model import AttemptStatus, DeliveryStatus
    from kirim.store.base import AttemptOutcome, Finish, Intent, NewDelivery
    from kirim.store.postgres import PostgresStore

    db = await fresh_postgres(url, "kirim_finish_bench")
    store = PostgresStore(db)
    await store.open()
    await store.migrate()
    text = canonical_json({"title": "hi"})
    items = [
        NewDelivery(
            idempotency_key=f"k{i}",
            event_id=f"e{i}",
            recipient=f"u{i}",
            channel="push",
            payload_json=text,
            payload_hash=payload_hash(text),
            run_at=0.0,
            max_attempts=3,
        )
        for i in range(notifications)
    ]
    for i in range(0, notifications, 1000):
        await store.enqueue(items[i : i + 1000], now=1000.0)
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
        started = time.perf_counter()
        try:
            for batch in batches:
                results = await store.finish(batch)
                assert all(r.committed for r in results)
            seconds = time.perf_counter() - started
        finally:
            psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]
            psycopg.AsyncConnection.transaction = transaction  # type: ignore[method-assign]
        cur = await conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn,))
        wal = float((await cur.fetchone())[0])
    await store.close()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        await admin.execute("DROP DATABASE IF EXISTS kirim_finish_bench")
    done = sum(len(b) for b in batches)
    return {
        "deliveries": done,
        "batches": len(batches),
        "statements_per_batch": statements / len(batches),
        "transactions_per_batch": transactions / len(batches),
        "finish_wal_bytes_per_delivery": round(wal / done),
        "finish_us_per_delivery": round(seconds / done * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", required=True, help="a PostgreSQL server's URL")
    parser.add_argument("--notifications", type=int, default=5000)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.database, args.notifications))))


if __name__ == "__main__":
    main()
