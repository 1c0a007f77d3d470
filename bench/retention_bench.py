"""Delivery throughput with a large finished ledger against an empty one, and what a
prune batch costs there. Prints; asserts nothing.

For each backend: a scratch database (a temporary SQLite file; a throw-away
PostgreSQL database on the server of ``--postgres``, dropped after) is either left
empty (a fresh one per run) or filled, once, with ``--ledger`` finished deliveries
(sent, each with its completed job and its succeeded attempt, 100 days old) by bulk
SQL in one transaction (SQLite: ``INSERT … SELECT`` from a recursive CTE;
PostgreSQL: ``generate_series``), never through ``notify()``. Then
``--notifications`` fresh notifications are enqueued (``kirim.devtools.bench._enqueue``) and
delivered by ``--workers`` worker processes to a zero-latency provider
(``kirim.devtools.bench._worker``, as ``kirim bench`` runs them, without its progress lines:
they count every delivery, a scan of the whole ledger), in ``--rounds`` runs that
alternate empty and filled, so that a busy machine's noise falls on both alike.
Last, on the filled ledger, prune batches (``Store.prune``) are timed.

Run alone: ``python bench/retention_bench.py [--postgres URL] [--ledger N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kirim.devtools.bench import _app, _enqueue, _worker, run_together, say, with_sync
from kirim.observe.logging import configure
from kirim.simulate.harness import scratch_database

DAY = 86_400.0
SQLITE_FILL = [
    """
    WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :count)
    INSERT INTO kirim_deliveries
        (id, idempotency_key, event_id, recipient, channel, payload, payload_hash, status,
         provider_message_id, created_at, updated_at, sent_at)
    SELECT i, printf('ledger-%058d', i), printf('ledger-%d', i), 'u', 'bench',
           printf('{"n": %d}', i), lower(hex(randomblob(32))), 'sent', printf('p-%d', i),
           :t, :t, :t
    FROM n
    """,
    """
    INSERT INTO kirim_jobs
        (id, delivery_id, status, run_at, attempts, max_attempts, created_at, updated_at)
    SELECT id, id, 'completed', :t, 1, 8, :t, :t FROM kirim_deliveries
    """,
    """
    INSERT INTO kirim_attempts
        (id, delivery_id, job_id, number, provider_request_id, worker_id, status,
         provider_message_id, requested_at, completed_at, send_deadline, settles_at)
    SELECT id, id, id, 1, lower(hex(randomblob(16))), 'bench', 'succeeded',
           provider_message_id, :t, :t, :t, :t
    FROM kirim_deliveries
    """,
]
POSTGRES_FILL = [
    """
    INSERT INTO kirim_deliveries
        (id, idempotency_key, event_id, recipient, channel, payload, payload_hash, status,
         provider_message_id, created_at, updated_at, sent_at)
    SELECT i, 'ledger-' || lpad(i::text, 58, '0'), 'ledger-' || i, 'u', 'bench',
           '{"n": ' || i || '}', md5(i::text) || md5((-i)::text), 'sent', 'p-' || i,
           %(t)s, %(t)s, %(t)s
    FROM generate_series(1, %(count)s) AS i
    """,
    """
    INSERT INTO kirim_jobs
        (id, delivery_id, status, run_at, attempts, max_attempts, created_at, updated_at)
    SELECT id, id, 'completed', %(t)s, 1, 8, %(t)s, %(t)s FROM kirim_deliveries
    """,
    """
    INSERT INTO kirim_attempts
        (id, delivery_id, job_id, number, provider_request_id, worker_id, status,
         provider_message_id, requested_at, completed_at, send_deadline, settles_at)
    SELECT id, id, id, 1, md5('r' || id), 'bench', 'succeeded',
           provider_message_id, %(t)s, %(t)s, %(t)s, %(t)s
    FROM kirim_deliveries
    """,
    # the rows were given their ids: move the identities past them
    *(
        f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
        for table in ("kirim_deliveries", "kirim_jobs", "kirim_attempts")
    ),
]


async def _migrate(url: str) -> None:
    app = _app(url)
    await app.open(migrate=True)
    await app.close()


def fill(url: str, count: int) -> float:
    """``count`` sent deliveries with their jobs and attempts, 100 days old; seconds."""
    started = time.perf_counter()
    t = time.time() - 100 * DAY
    if url.startswith("sqlite:"):
        path = url.removeprefix("sqlite:///").partition("?")[0]
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            for sql in SQLITE_FILL:
                db.execute(sql, {"count": count, "t": t})
            db.execute("COMMIT")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()
    else:
        import psycopg

        from kirim.store.postgres import postgres_conninfo

        conninfo, _ = postgres_conninfo(url)
        with psycopg.connect(conninfo) as conn:
            for sql in POSTGRES_FILL:
                conn.execute(sql, {"count": count, "t": t})
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")  # what autovacuum would have done by now
    return time.perf_counter() - started


def deliver(url: str, notifications: int, workers: int, offset: int = 0) -> dict[str, Any]:
    """Enqueue ``notifications`` new ones (event ids from ``offset`` on), deliver them.
    PostgreSQL: ANALYZE in between, so that an empty database's planner knows the rows
    just enqueued (autovacuum would, a little later) as the filled one's knows its own."""
    enqueue_s = asyncio.run(_enqueue(url, notifications, offset))
    if not url.startswith("sqlite:"):
        import psycopg

        from kirim.store.postgres import postgres_conninfo

        with psycopg.connect(postgres_conninfo(url)[0], autocommit=True) as conn:
            conn.execute("ANALYZE")
    results = run_together(_worker, (url, False), workers)
    seconds = max(r[1] for r in results) - min(r[0] for r in results)
    sent = sum(r[2] for r in results)
    return {
        "enqueues_per_s": round(notifications / enqueue_s, 1),
        "delivered": sent,
        "deliveries_per_s": round(sent / seconds, 1),
        "delivery_seconds": round(seconds, 3),
    }


async def time_prune(url: str, batches: int, limit: int) -> dict[str, Any]:
    """``batches`` prune batches of ``limit`` (keep 30 days) on the filled ledger."""
    app = _app(url)
    await app.open()
    try:
        store: Any = app.store
        dry_started = time.perf_counter()
        dry = await store.prune(now=time.time(), keep=30 * DAY, keys=365 * DAY, dry_run=True)
        dry_s = time.perf_counter() - dry_started
        took = []
        pruned = 0
        for _ in range(batches):
            started = time.perf_counter()
            done = await store.prune(now=time.time(), keep=30 * DAY, keys=365 * DAY, limit=limit)
            took.append(time.perf_counter() - started)
            pruned += done.deliveries
        # nothing to prune (every finished delivery is recent): the cost of a round
        idle_started = time.perf_counter()
        await store.prune(now=time.time(), keep=1000 * DAY, keys=365 * DAY, limit=limit)
        idle_s = time.perf_counter() - idle_started
    finally:
        await app.close()
    return {
        "dry_run_seconds": round(dry_s, 3),
        "dry_run_deliveries": dry.deliveries,
        "batch": limit,
        "batch_ms_median": round(sorted(took)[len(took) // 2] * 1000, 1),
        "batch_ms_max": round(max(took) * 1000, 1),
        "pruned_per_s": round(pruned / sum(took), 1),
        "round_with_nothing_to_prune_ms": round(idle_s * 1000, 1),
    }


@contextlib.contextmanager
def scratch(backend: str, postgres: str | None, folder: Path, name: str) -> Iterator[str]:
    if backend == "postgres":
        with scratch_database(postgres, folder) as url:
            yield url
        return
    yield f"sqlite:///{folder / name}"


def measure(
    backend: str,
    postgres: str | None,
    ledger: int,
    notifications: int,
    workers: int,
    sync: str,
    rounds: int,
) -> dict[str, Any]:
    """``rounds`` runs on a fresh empty database each, alternating with runs on one filled
    ledger (filled once; each run adds ``notifications`` to it): the machine's noise
    falls on both alike. The rates are per run, with their median."""
    out: dict[str, Any] = {"backend": backend, "workers": workers, "ledger": ledger}
    runs: dict[str, list[float]] = {"empty": [], "filled": []}
    with (
        tempfile.TemporaryDirectory(prefix="kirim-retention-") as tmp,
        scratch(backend, postgres, Path(tmp), "filled.db") as filled,
    ):
        if backend == "sqlite":
            filled = with_sync(filled, sync)
        asyncio.run(_migrate(filled))
        say(f"{backend}: filling the ledger with {ledger:,} finished deliveries")
        out["fill_seconds"] = round(fill(filled, ledger), 1)
        for n in range(rounds):
            with scratch(backend, postgres, Path(tmp), f"empty-{n}.db") as empty:
                if backend == "sqlite":
                    empty = with_sync(empty, sync)
                asyncio.run(_migrate(empty))
                for case, url in (("empty", empty), ("filled", filled)):
                    done = deliver(url, notifications, workers, n * notifications)
                    rate = done["deliveries_per_s"]
                    runs[case].append(rate)
                    say(f"{backend} {case} run {n + 1}: {rate:,.0f} deliveries/s")
        out["prune"] = asyncio.run(time_prune(filled, 10, 500))
    for case, rates in runs.items():
        out[case] = {"deliveries_per_s": rates, "median": sorted(rates)[len(rates) // 2]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    parser.add_argument("--ledger", type=int, default=1_000_000)
    parser.add_argument("--notifications", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sync", choices=["full", "normal"], default="full")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    configure(level="warning")
    backends = [args.only] if args.only else ["sqlite", "postgres"]
    for backend in backends:
        result = measure(
            backend,
            args.postgres,
            args.ledger,
            args.notifications,
            args.workers,
            args.sync,
            args.rounds,
        )
        print(json.dumps(result), flush=True)
        empty, filled = result["empty"]["median"], result["filled"]["median"]
        print(
            f"{backend}: median of {args.rounds} runs: {empty:,.0f} deliveries/s empty, "
            f"{filled:,.0f}/s with {args.ledger:,} finished deliveries ({filled / empty - 1:+.1%})",
            flush=True,
        )


if __name__ == "__main__":
    main()
