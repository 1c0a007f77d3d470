"""Where PostgreSQL's time goes, statement by statement, while one worker drains.

``python bench/statement_costs.py [--notifications 10000] [--json]`` starts a private
PostgreSQL server (``tests/pgserver.py``: ``initdb`` in a temporary folder, a free port
of 127.0.0.1, stopped and removed at the end) with ``pg_stat_statements`` loaded and
its planning time tracked, enqueues N notifications into a throw-away database there,
clears the statistics, drains the queue with one worker in this process
(``bench/profile_worker.py``'s drain, to a zero-latency provider), and prints each
statement the drain ran: its kirim name (matched against ``store/postgres/sql``), its
calls, its rows per call, the server's execution and planning time per delivery, and
the WAL it wrote per delivery (the records of its rows: without commits, page headers
and the full-page images a checkpoint brings, which ``bench/wal_breakdown.py`` counts).
The sum is the server's statement time per delivery; what it leaves out (parsing,
the protocol, commits) is the rest of the server's CPU that ``kirim bench`` reports.

kirim sends every statement unprepared (docs/deploying.md: it works behind a pooler
in transaction mode), so each call is parsed and planned again: the planning column
says what that costs. The private server skips fsync (as the tests' do): commit costs
are not under measure here, the statements' work is. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import psycopg

from kirim.devtools.bench import _enqueue
from kirim.observe.logging import configure
from kirim.store.sqlfiles import load_queries

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from profile_worker import _drain  # one worker until the queue is empty

import pgserver  # tests/: the private server the fault tests use

#: what the private server loads on top of the tests' settings
STATS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.track_planning": "on",
    "shared_buffers": "128MB",
}

_COMMENT = re.compile(r"--[^\n]*")
#: what the server numbers as a constant ($n), and kirim's placeholders
_LITERAL = re.compile(
    r"'(?:[^']|'')*'|%\(\w+\)s|\$\d+|\b\d+(?:\.\d+)?\b|\b(?:true|false|null)\b", re.IGNORECASE
)


def shape(sql: str) -> str:
    """A statement's text with comments, literals and placeholders blanked and its
    spaces collapsed: kirim's text (``%(name)s``) and the server's record of it (``$n``,
    its constants numbered too) come out the same."""
    text = _LITERAL.sub("?", _COMMENT.sub(" ", sql))
    return " ".join(text.replace("(", " ( ").replace(")", " ) ").split())


def names() -> dict[str, str]:
    """kirim's PostgreSQL statements by shape."""
    return {shape(sql): name for name, sql in load_queries("postgres").items()}


def _statements(admin: str, database: str, n: int) -> list[dict[str, Any]]:
    """The drain's statements, costliest first (times in µs per delivery)."""
    known = names()
    query = """
        SELECT s.query, s.calls, s.rows, s.total_exec_time, s.total_plan_time, s.wal_bytes
        FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
        WHERE d.datname = %s ORDER BY s.total_exec_time + s.total_plan_time DESC
    """
    with psycopg.connect(admin, autocommit=True) as conn:
        rows = conn.execute(query, (database,)).fetchall()
    found = []
    for text, calls, count, exec_ms, plan_ms, wal in rows:
        head = " ".join(text.split())[:60]
        found.append(
            {
                "statement": known.get(shape(text), head),
                "calls": calls,
                "rows_per_call": round(count / calls, 1) if calls else 0.0,
                "exec_us": round(exec_ms * 1000 / n, 2),
                "plan_us": round(plan_ms * 1000 / n, 2),
                "wal_bytes": round(float(wal) / n, 1),
            }
        )
    return found


def measure(n: int) -> dict[str, Any]:
    """Start the private server, measure one drain of ``n`` notifications, stop it."""
    with pgserver.running(STATS) as server:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        url = server.create_database("kirim_costs")
        asyncio.run(_enqueue(url, n, 0))  # the schema made first (migrate=True)
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
        sent, _, _ = asyncio.run(_drain(url, None, None))  # no profiler
        statements = _statements(server.url(), "kirim_costs", sent)
    return {
        "notifications": n,
        "sent": sent,
        "exec_us_per_delivery": round(sum(s["exec_us"] for s in statements), 1),
        "plan_us_per_delivery": round(sum(s["plan_us"] for s in statements), 1),
        "wal_bytes_per_delivery": round(sum(s["wal_bytes"] for s in statements), 1),
        "statements": statements,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notifications", type=int, default=10_000)
    parser.add_argument("--json", action="store_true", help="one JSON object, not a table")
    args = parser.parse_args()
    why = pgserver.unavailable()
    if why is not None:
        print(f"skipped: {why}")
        return 0
    configure(level="warning", fmt="json", stream=sys.stderr)
    result = measure(args.notifications)
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{result['sent']:,} delivered by one worker; server statement time per delivery: "
        f"{result['exec_us_per_delivery']} µs executing, "
        f"{result['plan_us_per_delivery']} µs planning; WAL {result['wal_bytes_per_delivery']} B"
    )
    print(f"{'statement':<34}{'calls':>7}{'rows/call':>11}{'exec µs':>9}{'plan µs':>9}{'WAL B':>8}")
    for s in result["statements"]:
        if s["exec_us"] + s["plan_us"] < 0.05:
            continue
        print(
            f"{s['statement'][:33]:<34}{s['calls']:>7}{s['rows_per_call']:>11}"
            f"{s['exec_us']:>9}{s['plan_us']:>9}{s['wal_bytes']:>8}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
