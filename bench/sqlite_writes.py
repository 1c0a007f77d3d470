"""What each row of the transitions' write-backs costs on SQLite (``write_*``, µs/row).

Enqueues N notifications (as ``kirim bench`` does), drains them with one worker in
this process, and times every statement the SQLite driver runs for the claim, intent
and finish write-backs (``kirim.store.sqlite.driver.execute``, wrapped: binding and
SQLite's own work, on the driver's thread), then prints the time per row written of
each, the median of ``--rounds`` fresh runs. The time is the CPU time of the driver's
thread (``time.thread_time``): what other processes on the machine do barely moves
it. Prints; asserts nothing.

``--direct``: the write-backs alone, whole rows against only the changed columns
(``kirim.store.sqlite.changed``), on one file of ``--notifications`` deliveries and
jobs: batches of 64 rows written as a claim and then as a finish writes them, the
whole-row statement and the narrowed one taking turns batch by batch (the narrowed
time includes comparing each record with its row as read), the median per row.

    .venv/bin/python bench/sqlite_writes.py --notifications 5000 --rounds 3
    .venv/bin/python bench/sqlite_writes.py --direct --notifications 20000
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from kirim.devtools.bench import _app, _enqueue, settings_for
from kirim.observe.logging import configure
from kirim.store.sqlfiles import migrations
from kirim.store.sqlite import driver
from kirim.store.sqlite.driver import Q, _statements, positional

#: the statements timed: the write-backs of claim and finish, and the intents
TIMED = ("write_deliveries", "write_jobs", "write_attempts", "insert_intents")
#: told apart by the status the rows are written with (a claim's, or a finish's)
_BY_STATUS = ("write_deliveries", "write_jobs")
#: the lines printed
SHOWN = (
    "write_deliveries (claim)",
    "write_jobs (claim)",
    "insert_intents",
    "write_attempts",
    "write_deliveries (finish)",
    "write_jobs (finish)",
)


def _timed(
    spent: dict[str, float], rows: dict[str, int]
) -> Any:  # the wrapped ``execute``, same signature
    real = driver.execute

    def execute(conn: Any, step: Any) -> Any:
        if step.name not in TIMED:
            return real(conn, step)
        items = step.args.get("items") or ()
        name = step.name
        if name in _BY_STATUS and items:
            name += " (claim)" if items[0]["status"] in ("processing", "running") else " (finish)"
        started = time.thread_time()
        result = real(conn, step)
        spent[name] += time.thread_time() - started
        rows[name] += len(items)
        return result

    return execute


async def _drain(url: str) -> None:
    app = _app(url)
    await app.open()
    try:
        await app.worker(settings=settings_for(url)).run(burst=True)
    finally:
        await app.close()


def one_round(n: int) -> dict[str, float]:
    """µs per row of each timed statement, in one fresh database of ``n`` deliveries."""
    spent: dict[str, float] = defaultdict(float)
    rows: dict[str, int] = defaultdict(int)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'writes.db'}"
        asyncio.run(_enqueue(url, n, 0))
        real = driver.execute
        driver.execute = _timed(spent, rows)
        try:
            asyncio.run(_drain(url))
        finally:
            driver.execute = real
    return {name: 1e6 * spent[name] / rows[name] for name in rows if rows[name]}


# -- --direct: whole rows against the changed columns, on the same file --------------

_BATCH = 64
_NEW_DELIVERY = (
    "INSERT INTO kirim_deliveries (id, idempotency_key, event_id, recipient, channel, "
    "payload, payload_hash, status, created_at, updated_at) "
    "VALUES (?1, 'k' || ?1, 'e' || ?1, 'u', 'bench', '{\"n\": 1}', 'h', 'pending', 1.0, 1.0)"
)
_NEW_JOB = (
    "INSERT INTO kirim_jobs (id, delivery_id, status, run_at, attempts, max_attempts, "
    "created_at, updated_at) VALUES (?1, ?1, 'queued', 1.0, 0, 8, 1.0, 1.0)"
)


def _claimed_delivery(row: Any, t: float) -> dict[str, Any]:
    return {**{c: row[c] for c in _DELIVERY}, "status": "processing", "claim_token": f"t{t}",
            "claimed_by": "w", "claim_expires_at": t + 10.0, "updated_at": t}  # fmt: skip


def _finished_delivery(row: Any, t: float) -> dict[str, Any]:
    return {**{c: row[c] for c in _DELIVERY}, "status": "sent", "claim_token": None,
            "claimed_by": None, "claim_expires_at": None, "provider_message_id": "m",
            "sent_at": t, "updated_at": t}  # fmt: skip


def _claimed_job(row: Any, t: float) -> dict[str, Any]:
    return {**{c: row[c] for c in _JOB}, "status": "running", "attempts": row["attempts"] + 1,
            "lease_owner": "w", "lease_token": f"t{t}", "lease_expires_at": t + 10.0,
            "updated_at": t}  # fmt: skip


def _finished_job(row: Any, t: float) -> dict[str, Any]:
    return {**{c: row[c] for c in _JOB}, "status": "completed", "lease_owner": None,
            "lease_token": None, "lease_expires_at": None, "updated_at": t}  # fmt: skip


_DELIVERY = ("id", "status", "doubt", "claim_token", "claimed_by", "claim_expires_at",
             "provider_message_id", "last_error", "sent_at", "released_at", "reason",
             "updated_at")  # fmt: skip
_JOB = ("id", "status", "run_at", "attempts", "lease_owner", "lease_token",
        "lease_expires_at", "last_error", "updated_at")  # fmt: skip
_STEPS = (
    ("write_deliveries (claim)", "write_deliveries", "kirim_deliveries", _claimed_delivery),
    ("write_jobs (claim)", "write_jobs", "kirim_jobs", _claimed_job),
    ("write_deliveries (finish)", "write_deliveries", "kirim_deliveries", _finished_delivery),
    ("write_jobs (finish)", "write_jobs", "kirim_jobs", _finished_job),
)


def direct(n: int) -> dict[tuple[str, str], float]:
    """µs per row of each write-back, ``whole`` and ``changed``, on ``n`` fresh rows."""
    from kirim.store.sqlite.changed import write_changed  # (not in kirim before it)

    found: dict[tuple[str, str], list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        conn = sqlite3.connect(Path(tmp) / "direct.db", isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(Q["create_meta"])
        for _, sql in migrations("sqlite"):
            for statement in _statements(sql):
                conn.execute(statement)
        conn.execute("BEGIN")
        conn.executemany(_NEW_DELIVERY, [(i,) for i in range(1, n + 1)])
        conn.executemany(_NEW_JOB, [(i,) for i in range(1, n + 1)])
        conn.execute("COMMIT")
        for k, lo in enumerate(range(1, n + 1, _BATCH)):
            ids = list(range(lo, min(lo + _BATCH, n + 1)))
            how = "changed" if k % 2 else "whole"
            for shown, name, table, make in _STEPS:
                marks = ", ".join("?" * len(ids))
                read = conn.execute(
                    f"SELECT * FROM {table} WHERE id IN ({marks}) ORDER BY id", ids
                ).fetchall()
                records = [make(row, float(lo)) for row in read]
                conn.execute("BEGIN IMMEDIATE")
                started = time.thread_time()
                if how == "changed":
                    write_changed(conn, Q[name], records, read, positional)
                else:
                    numbered, pick = positional(Q[name])
                    conn.executemany(numbered, [pick(r) for r in records])
                found[shown, how].append(1e6 * (time.thread_time() - started) / len(ids))
                conn.execute("COMMIT")
        conn.close()
    return {key: statistics.median(us) for key, us in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notifications", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--direct", action="store_true", help="whole rows against changed")
    args = parser.parse_args()
    configure(level="warning")
    if args.direct:
        rounds = [direct(args.notifications) for _ in range(args.rounds)]
        for shown, *_ in _STEPS:
            whole = [r[shown, "whole"] for r in rounds]
            narrowed = [r[shown, "changed"] for r in rounds]
            print(
                f"{shown:26} whole {statistics.median(whole):5.1f}, changed columns "
                f"{statistics.median(narrowed):5.1f} µs/row  (rounds: "
                + " ".join(f"{w:.1f}/{c:.1f}" for w, c in zip(whole, narrowed, strict=True))
                + ")"
            )
        return
    found: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.rounds):
        for name, us in one_round(args.notifications).items():
            found[name].append(us)
    for name in SHOWN:
        if found[name]:
            shown = " ".join(f"{us:.1f}" for us in found[name])
            print(f"{name:26} {statistics.median(found[name]):6.1f} µs/row  (rounds: {shown})")


if __name__ == "__main__":
    main()
