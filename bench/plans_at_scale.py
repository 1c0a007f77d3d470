"""The hot path's plans on a ledger of N deliveries (10,000 to 10,000,000): index lookups
at any table size (issue 24, item 2).

``tests/contract/test_postgres_plans.py`` checks the plans on a ledger of 10,000
deliveries (half of them in flight) with fresh, stale and no statistics. This runs
the same statements with the same batch (256 deliveries, ids 5001-5256), on the same
ledger made ``--rows`` long, its statistics fresh (ANALYZE after the fill), under
``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` in a transaction rolled back, and prints
per statement (after ``no_jit``, and ``plan_by_index`` where the code sends it, as the
driver does): the execution and planning time, the JIT's compile time (None: not
compiled), the buffers touched, the most rows any node read from one of kirim's
tables, and each sequential scan. Then the
backlog checks of the tests: ``due_jobs`` and ``claim_fresh`` with 5,000 jobs queued
since ANALYZE (half of their deliveries fresh), after ``plan_by_index``. A plan that
stays on index lookups reads about the batch whatever the table's size, and takes
about as long at 10 million as at 10,000.

    .venv/bin/python bench/plans_at_scale.py --rows 10000000
    .venv/bin/python bench/plans_at_scale.py --rows 10000 --keep   # leave the database

On a throw-away database of the server (``--database``, default the local one),
dropped after unless ``--keep``. Prints; asserts nothing. The fill of 10 million
deliveries, their jobs and attempts takes a while and some 10 GB of disk.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
NAME = "kirim_plans_at_scale"
#: the claim's statements that run after plan_by_index (transitions.claim, _fresh),
#: beside the careful transitions' (the tests' CAREFUL); the others run without it
CLAIM_PLANNED = ("due_jobs", "claim_fresh", "claim_history")


def _checks() -> ModuleType:
    """The statements, batch and ledger of tests/contract/test_postgres_plans.py."""
    sys.path.insert(0, str(TESTS))
    path = TESTS / "contract" / "test_postgres_plans.py"
    spec = importlib.util.spec_from_file_location("plans_checks", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _explain(conn: Any, sql: str, args: dict[str, Any], first: tuple[bytes, ...]) -> dict[str, Any]:
    from kirim.store.postgres.driver import bind

    with conn.transaction(force_rollback=True):
        for statement in first:
            conn.execute(statement)
        [[found]] = conn.execute(
            ("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql).encode(),
            bind({"now": 1.0, **args}),
        ).fetchall()
    return found[0]  # type: ignore[no-any-return]


def summary(name: str, found: dict[str, Any], checks: ModuleType) -> dict[str, Any]:
    """What one statement's plan read and took."""
    nodes = checks._nodes(found["Plan"])
    read = [
        n["Actual Rows"] * n["Actual Loops"] + n.get("Rows Removed by Filter", 0)
        for n in nodes
        if str(n.get("Relation Name", "")).startswith("kirim_")
    ]
    top = found["Plan"]
    buffers = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
    return {
        "statement": name,
        "execution_ms": round(found["Execution Time"], 2),
        "planning_ms": round(found["Planning Time"], 2),
        # the JIT's compile time (None: not compiled; the driver turns it off)
        "jit_ms": round(found["JIT"]["Timing"]["Total"], 2) if "JIT" in found else None,
        "buffers": buffers,
        "most_rows_read": max(read, default=0),
        "seq_scans": sorted({n["Relation Name"] for n in nodes if n["Node Type"] == "Seq Scan"}),
    }


def fill(url: str, rows: int, checks: ModuleType) -> float:
    """Make the ledger of ``rows`` deliveries (the tests' rows, longer); seconds taken."""
    import psycopg

    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in checks.FILL:
            sized = sql.replace(f"generate_series(1, {checks.ROWS})", f"generate_series(1, {rows})")
            print(f"  {sized.split('(')[0][:40].strip()} ...", file=sys.stderr, flush=True)
            conn.execute(sized.encode())
    return time.perf_counter() - started


def measure(url: str, checks: ModuleType) -> list[dict[str, Any]]:
    """Each statement of the tests' READ_ONCE on the batch, then the backlog checks."""
    import psycopg

    from kirim.store.sqlfiles import load_queries

    queries = load_queries("postgres")
    flight = (b"UPDATE kirim_deliveries SET claim_token = 't' WHERE id > 5000 AND id <= 5256",)
    out = []
    with psycopg.connect(url) as conn:
        for name in sorted(checks.READ_ONCE):
            planned = name in CLAIM_PLANNED or name in checks.CAREFUL
            first = (*flight, checks.PLAN_BY_INDEX) if planned else flight
            found = _explain(conn, queries[name], checks.READ_ONCE[name], (checks.NO_JIT, *first))
            out.append(summary(name, found, checks))
        backlog = (
            b"UPDATE kirim_jobs SET status = 'queued' WHERE id <= 5000",
            b"UPDATE kirim_deliveries SET status = 'pending' WHERE id <= 5000",
            b"DELETE FROM kirim_attempts WHERE delivery_id <= 5000 AND delivery_id % 2 = 0",
            checks.PLAN_BY_INDEX,
        )
        for name, args in (
            ("due_jobs", {"now": 1e12, "limit": 256}),
            ("claim_fresh", checks.FRESH),
        ):
            found = _explain(conn, queries[name], args, (checks.NO_JIT, *backlog))
            out.append(summary(f"{name} (backlog)", found, checks))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--database", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--keep", action="store_true", help="leave the database (to rerun)")
    parser.add_argument("--reuse", action="store_true", help="measure a database left by --keep")
    parser.add_argument("--name", default=NAME, help=f"the throw-away database (default {NAME})")
    args = parser.parse_args()
    import asyncio

    import psycopg
    from fresh_db import fresh_ledger

    checks = _checks()
    name = args.name
    url = args.database.rsplit("/", 1)[0] + "/" + name
    if not args.reuse:
        asyncio.run(fresh_ledger(args.database, name))
        print(f"filling {args.rows:,} deliveries, jobs and attempts", file=sys.stderr)
        took = fill(url, args.rows, checks)
        print(f"filled in {took:.0f} s", file=sys.stderr)
    try:
        for row in measure(url, checks):
            print(json.dumps({"rows": args.rows, **row}))
    finally:
        if not args.keep:
            with psycopg.connect(args.database, autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


if __name__ == "__main__":
    main()
