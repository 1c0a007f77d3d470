"""A claim's joined row read and decoded by the SQLite driver, as ``sqlite3.Row`` and as
the dicts ``driver.rows_of`` makes: microseconds per row.

``due_jobs`` gives a claim each delivery joined with its job (33 columns); the claim
decodes both (``delivery_from``, ``job_of``). ``sqlite3.Row`` finds a column by name
by comparing it, ignoring case, with every column before it; a dict finds it in one
probe. Both read the same ``--rows`` rows of a table, each way timed alone (best of
``--repeat`` runs of ``--number`` reads), in one tree. Prints; asserts nothing.

    .venv/bin/python bench/sqlite_rows_bench.py
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import timeit
from typing import Any

from kirim.store.rows import delivery_from, job_of
from kirim.store.sqlite.driver import rows_of

DELIVERY: dict[str, Any] = {
    "id": 1,
    "idempotency_key": "k" * 64,
    "event_id": "evt-1",
    "recipient": "user@example.com",
    "channel": "email",
    "payload": json.dumps({"subject": "hello", "n": 1}),
    "payload_hash": "h" * 64,
    "status": "pending",
    "claim_token": None,
    "claimed_by": None,
    "claim_expires_at": None,
    "provider_message_id": None,
    "doubt": None,
    "last_error": None,
    "created_at": 1.0,
    "updated_at": 1.0,
    "sent_at": None,
    "type": "welcome",
    "recipient_id": "u1",
    "reason": None,
    "released_at": None,
}
JOB: dict[str, Any] = {
    "job_id": 1,
    "job_delivery_id": 1,
    "job_status": "queued",
    "job_run_at": 1.0,
    "job_attempts": 0,
    "job_max_attempts": 5,
    "job_lease_owner": None,
    "job_lease_token": None,
    "job_lease_expires_at": None,
    "job_last_error": None,
    "job_created_at": 1.0,
    "job_updated_at": 1.0,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=50)
    parser.add_argument("--number", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    row = DELIVERY | JOB
    conn = sqlite3.connect(":memory:")
    conn.row_factory = sqlite3.Row
    conn.execute(f"CREATE TABLE due ({', '.join(row)})")
    marks = ", ".join("?" * len(row))
    conn.executemany(f"INSERT INTO due VALUES ({marks})", [tuple(row.values())] * args.rows)
    sql = "SELECT * FROM due"

    def as_rows() -> None:
        for r in conn.execute(sql).fetchall():
            delivery_from(r)
            job_of(r)

    def as_dicts() -> None:
        cursor = conn.cursor()
        cursor.row_factory = None
        cursor.execute(sql)
        for r in rows_of(cursor):
            delivery_from(r)
            job_of(r)

    for name, fn in (("sqlite3.Row", as_rows), ("dict rows", as_dicts)):
        best = min(timeit.repeat(fn, number=args.number, repeat=args.repeat))
        print(f"{name:12} {best / args.number / args.rows * 1e6:6.2f} us per row")


if __name__ == "__main__":
    main()
