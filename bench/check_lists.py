"""What a list of constants in a CHECK or a partial index's predicate costs SQLite per row.

SQLite evaluates ``x IN ('a', 'b', 'c')`` (three constants or more) by building a
temporary B-tree of the list once per run of the statement; a statement run once per
row (``executemany``: kirim's finish, intent and enqueue on SQLite) builds it for every
row, for each CHECK naming a column the statement writes and for the predicate of each
partial index over a column it changes. A list of two constants, or a chain of ``=``
joined by OR, is plain comparisons. Migration 0019 spells kirim's schema so.

Each case updates one row's ``status`` per run of an ``executemany`` over 20,000 rows of
an in-memory table (best of 3, rolled back each time) and prints the microseconds per
row. Prints; asserts nothing. ``python bench/check_lists.py``
"""

from __future__ import annotations

import sqlite3
import time

ROWS = 20_000
TABLE = "CREATE TABLE t (id INTEGER PRIMARY KEY, status TEXT NOT NULL{check}, x INTEGER)"
CASES = {
    "no check": (TABLE.format(check=""), ""),
    "CHECK (status IN (5 constants))": (
        TABLE.format(check=" CHECK (status IN ('a', 'b', 'c', 'd', 'e'))"),
        "",
    ),
    "CHECK (status IN (10 constants))": (
        TABLE.format(check=" CHECK (status IN ('a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j'))"),
        "",
    ),
    "CHECK (5 = joined by OR)": (
        TABLE.format(
            check=" CHECK (status = 'a' OR status = 'b' OR status = 'c' OR status = 'd'"
            " OR status = 'e')"
        ),
        "",
    ),
    "partial index, status IN (3 constants)": (
        TABLE.format(check=""),
        "CREATE INDEX i ON t (x) WHERE status IN ('a', 'b', 'c')",
    ),
    "partial index, status NOT IN (2 constants)": (
        TABLE.format(check=""),
        "CREATE INDEX i ON t (x) WHERE status NOT IN ('d', 'e')",
    ),
}


def per_row(table: str, index: str) -> float:
    """Microseconds per row of ``UPDATE t SET status = ? WHERE id = ?`` run per row."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute(table)
    if index:
        conn.execute(index)
    rows = [(i,) for i in range(ROWS)]
    conn.executemany("INSERT INTO t (id, status, x) VALUES (?, 'a', 0)", rows)
    changes = [("b" if i % 2 else "a", i) for i in range(ROWS)]
    best = float("inf")
    for _ in range(3):
        conn.execute("BEGIN")
        started = time.perf_counter()
        conn.executemany("UPDATE t SET status = ? WHERE id = ?", changes)
        best = min(best, time.perf_counter() - started)
        conn.execute("ROLLBACK")
    conn.close()
    return best / ROWS * 1e6


def main() -> None:
    print(f"SQLite {sqlite3.sqlite_version}: one row's status updated per run, {ROWS:,} rows")
    for name, (table, index) in CASES.items():
        print(f"  {per_row(table, index):5.2f} us  {name}")


if __name__ == "__main__":
    main()
