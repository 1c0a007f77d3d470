"""PostgreSQL: the hot path's statements look a batch's rows up by index, on a ledger of
10,000 deliveries with fresh statistics, where a hash join over a scan of the whole
table is what the planner would otherwise take (a batch would then cost the table's
size). Plans, not times: ``EXPLAIN`` of each statement with a batch of 256.

(write_attempts is not here: at this size the planner scans the attempts rather than
probe the request ids' index 256 times, a cost it judges right; at a million rows it
probes.)

Then the same ledger with statistics that cannot be trusted (taken before the batch was
claimed, or none at all: docs/design.md, "Plans that do not trust the statistics"),
with ``EXPLAIN ANALYZE``: a batch's records are read once, a claim reads no more due
jobs than it takes, and after ``plan_by_index`` no careful statement reads more rows
than its batch names."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from kirim.store.postgres import PostgresStore
from kirim.store.postgres.driver import bind
from kirim.store.sqlfiles import load_queries
from pg import fresh_database

ROWS = 10_000
BATCH = list(range(5001, 5257))

ROWS_SQL = [
    "INSERT INTO kirim_deliveries (id, idempotency_key, event_id, recipient, channel, payload,"
    " payload_hash, status, provider_message_id, created_at, updated_at)"
    " SELECT g, 'k-' || g, 'e-' || g, 'r', 'email', '{\"n\": \"' || repeat('x', 200) || '\"}',"
    " 'h',"
    " CASE WHEN g > 5000 THEN 'processing' ELSE 'sent' END,"
    " CASE WHEN g > 5000 THEN NULL ELSE 'm-' || g END, g, g"
    f" FROM generate_series(1, {ROWS}) g",
    "INSERT INTO kirim_jobs (id, delivery_id, status, run_at, attempts, max_attempts,"
    " lease_token, created_at, updated_at)"
    " SELECT g, g, CASE WHEN g > 5000 THEN 'running' ELSE 'completed' END, g, 1, 5, 't', g, g"
    f" FROM generate_series(1, {ROWS}) g",
    "INSERT INTO kirim_attempts (delivery_id, job_id, number, provider_request_id, worker_id,"
    " status, requested_at) SELECT g, g, 1, 'q-' || g, 'w', 'requested', g"
    f" FROM generate_series(1, {ROWS}) g",
]
ANALYZE = "ANALYZE kirim_deliveries, kirim_jobs, kirim_attempts"
FILL = [*ROWS_SQL, ANALYZE]

#: statement -> its arguments for one batch, and the tables it must not scan whole
#: claim_fresh's arguments for a batch
FRESH = {"now": 1e12, "limit": 256, "lease": 30.0, "worker_id": "w", "checked_types": ["t"]}
STATEMENTS: dict[str, tuple[dict[str, Any], set[str]]] = {
    "due_jobs": ({"now": 1e12, "limit": 256}, {"kirim_deliveries"}),
    "claim_fresh": (FRESH, {"kirim_deliveries", "kirim_jobs", "kirim_attempts"}),
    "lock_deliveries": ({"ids": BATCH}, {"kirim_deliveries"}),
    "write_deliveries": (
        {
            "items": [
                {
                    "id": i,
                    "status": "sent",
                    "doubt": None,
                    "claim_token": None,
                    "claimed_by": None,
                    "claim_expires_at": None,
                    "provider_message_id": f"m-{i}",
                    "last_error": None,
                    "sent_at": 1.0,
                    "released_at": None,
                    "reason": None,
                    "updated_at": 1.0,
                }
                for i in BATCH
            ]
        },
        {"kirim_deliveries"},
    ),
    "write_jobs": (
        {
            "items": [
                {
                    "id": i,
                    "status": "completed",
                    "run_at": 1.0,
                    "attempts": 1,
                    "lease_owner": None,
                    "lease_token": None,
                    "lease_expires_at": None,
                    "last_error": None,
                    "updated_at": 1.0,
                }
                for i in BATCH
            ]
        },
        {"kirim_jobs"},
    ),
    "insert_intents": (
        {
            "items": [
                {
                    "delivery_id": i,
                    "job_id": i,
                    "token": "t",
                    "number": 2,
                    "request_id": f"r-{i}",
                    "worker_id": "w",
                    "requested_at": 1.0,
                    "send_deadline": 2.0,
                    "settles_at": 3.0,
                    "provider": None,
                }
                for i in BATCH
            ]
        },
        {"kirim_deliveries"},
    ),
    "finish_fenced": (
        {
            "items": [
                {
                    "delivery_id": i,
                    "job_id": i,
                    "token": "t",
                    "now": 2.0,
                    "request_id": f"q-{i}",
                    "outcome": "failed_transient" if i % 2 else "succeeded",
                    "outcome_message_id": None if i % 2 else f"m-{i}",
                    "outcome_error": "e" if i % 2 else None,
                    "completed_at": 2.0,
                    "status": "pending" if i % 2 else "sent",
                    "message_id": None if i % 2 else f"m-{i}",
                    "error": "e" if i % 2 else None,
                    "reason": None,
                    "job_status": "retry_scheduled" if i % 2 else "completed",
                    "run_at": None,
                    "delay": 5.0 if i % 2 else None,
                }
                for i in BATCH
            ]
        },
        {"kirim_deliveries", "kirim_jobs", "kirim_attempts"},
    ),
    "extend_leases": (
        {"items": [{"job_id": i, "delivery_id": i, "token": "t"} for i in BATCH], "until": 2.0},
        {"kirim_jobs"},
    ),
    "extend_claims": (
        {"items": [{"job_id": i, "delivery_id": i, "token": "t"} for i in BATCH], "until": 2.0},
        {"kirim_deliveries"},
    ),
}


@pytest.fixture(scope="module")
def ledger(ledgers: Callable[[str], str]) -> str:
    """A migrated database with a ledger of ``ROWS`` deliveries, half of them in flight."""
    return ledgers("fresh")


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_a_batch_is_looked_up_by_index(ledger: str, name: str) -> None:
    """No sequential scan of the tables the statement reads a batch's rows from."""
    args, tables = STATEMENTS[name]
    sql = load_queries("postgres")[name]
    with psycopg.connect(ledger) as conn, conn.transaction(force_rollback=True):
        rows = conn.execute(
            ("EXPLAIN (COSTS OFF) " + sql).encode(), bind({"now": 1.0, **args})
        ).fetchall()
    plan = "\n".join(str(r[0]) for r in rows)
    scanned = {t for t in tables if f"Seq Scan on {t}" in plan}
    assert scanned == set(), plan


#: no statistics yet: tables filled and never analyzed (a new ledger's first burst,
#: before autovacuum's first pass), where the planner guesses a selectivity for each
#: filter
AUTOVACUUM_OFF = [
    f"ALTER TABLE {t} SET (autovacuum_enabled = false)"
    for t in ("kirim_deliveries", "kirim_jobs", "kirim_attempts")
]
UNANALYZED = [*AUTOVACUUM_OFF, *ROWS_SQL]

#: the statistics of a quiet moment: every row at rest when ANALYZE ran, then the batch
#: claimed (its deliveries processing, its jobs running) with autovacuum off, so the
#: planner believes no row is processing or running: what a busy ledger's statistics
#: say of the rows of one batch
STALE = [
    *AUTOVACUUM_OFF,
    *(
        sql.replace("CASE WHEN g > 5000 THEN 'processing' ELSE 'sent' END", "'pending'").replace(
            "CASE WHEN g > 5000 THEN 'running' ELSE 'completed' END", "'queued'"
        )
        for sql in FILL
    ),
    "UPDATE kirim_deliveries SET status = 'processing', provider_message_id = NULL WHERE id > 5000",
    "UPDATE kirim_jobs SET status = 'running' WHERE id > 5000",
]

LEDGERS = {"fresh": FILL, "stale": STALE, "unanalyzed": UNANALYZED}


@pytest.fixture(scope="module")
def ledgers(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """The migrated database of each kind of ``LEDGERS``, filled on first use, once."""
    made: dict[str, str] = {}

    async def migrate(url: str) -> None:
        store = PostgresStore(url)
        await store.open()
        try:
            await store.migrate()
        finally:
            await store.close()

    def ledger_of(kind: str) -> str:
        if kind not in made:
            url = fresh_database(request)
            asyncio.run(migrate(url))
            with psycopg.connect(url, autocommit=True) as conn:
                for sql in LEDGERS[kind]:
                    conn.execute(sql.encode())
            made[kind] = url
        return made[kind]

    return ledger_of


@pytest.fixture(scope="module", params=sorted(LEDGERS))
def any_ledger(request: pytest.FixtureRequest, ledgers: Callable[[str], str]) -> str:
    """``ledger``'s rows with each state of the statistics (``LEDGERS``)."""
    return ledgers(request.param)


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


def _analyzed(url: str, name: str, args: dict[str, Any], *first: bytes) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, FORMAT JSON)`` of the named statement, after ``no_jit`` (as
    the driver sends every unit of work) and the statements ``first``, in a transaction
    rolled back."""
    with psycopg.connect(url) as conn, conn.transaction(force_rollback=True):
        for sql in (NO_JIT, *first):
            conn.execute(sql)
        [[found]] = conn.execute(
            ("EXPLAIN (ANALYZE, FORMAT JSON) " + load_queries("postgres")[name]).encode(),
            bind({"now": 1.0, **args}),
        ).fetchall()
    return found[0]


#: plan_by_index, as the claim and the careful transitions send it first
PLAN_BY_INDEX = load_queries("postgres")["plan_by_index"].encode()
#: no_jit, as the driver sends it first in every unit of work
NO_JIT = load_queries("postgres")["no_jit"].encode()


#: more of the hot path's statements on a batch (the claim's history, the careful
#: finish's reads and writes): read once too, though some may scan at this size
READ_ONCE: dict[str, dict[str, Any]] = {
    **{name: args for name, (args, _) in STATEMENTS.items()},
    "claim_history": {"ids": BATCH},
    "lock_jobs": {"delivery_ids": BATCH, "job_ids": BATCH},
    "attempts_of_deliveries": {"ids": BATCH},
    "write_attempts": {
        "items": [
            {
                "request_id": f"q-{i}",
                "status": "succeeded",
                "message_id": f"m-{i}",
                "error": None,
                "completed_at": 2.0,
            }
            for i in BATCH
        ]
    },
    "intents_written": {"request_ids": [f"q-{i}" for i in BATCH]},
    "write_message_ids": {"items": [{"delivery_id": i, "message_id": f"n-{i}"} for i in BATCH]},
}


@pytest.mark.parametrize("name", sorted(READ_ONCE))
def test_a_batch_is_read_once(any_ledger: str, name: str) -> None:
    """The batch's records (unnest) are read once, whatever the statistics say: never the
    inner side of a nested loop run again for each row of the table (a batch of n would
    cost n squared)."""
    found = _analyzed(
        any_ledger,
        name,
        READ_ONCE[name],
        b"UPDATE kirim_deliveries SET claim_token = 't' WHERE id > 5000",
    )
    nodes = _nodes(found["Plan"])
    rescanned = [
        (n["Node Type"], n.get("Alias"), n["Actual Loops"])
        for n in nodes
        if n["Node Type"] in ("Function Scan", "CTE Scan") and n["Actual Loops"] > 1
    ]
    assert rescanned == [], json.dumps(found, indent=1)


def test_a_claim_reads_no_more_due_jobs_than_it_takes(any_ledger: str) -> None:
    """A backlog the statistics have not seen (5,000 jobs queued since ANALYZE, or never
    analyzed) is read in claim order up to the batch, not sorted whole for each claim,
    and each due job's delivery is read once."""
    found = _analyzed(
        any_ledger,
        "due_jobs",
        {"now": 1e12, "limit": 256},
        b"UPDATE kirim_jobs SET status = 'queued' WHERE id <= 5000",
        PLAN_BY_INDEX,
    )
    read = [
        n["Actual Rows"] * n["Actual Loops"]
        for n in _nodes(found["Plan"])
        if n.get("Relation Name") == "kirim_jobs" or n.get("Index Name") == "kirim_jobs_due"
    ]
    assert read, json.dumps(found, indent=1)
    assert max(read) <= 256, json.dumps(found, indent=1)
    # each due job's delivery looked up once: never the due jobs read again per delivery
    # (a nested loop over them: 65,536 rows for a batch of 256, 20 ms of its 21)
    rescanned = [
        (n["Node Type"], n["Actual Loops"])
        for n in _nodes(found["Plan"])
        if n["Node Type"] in ("CTE Scan", "Function Scan") and n["Actual Loops"] > 1
    ]
    assert rescanned == [], json.dumps(found, indent=1)


def test_a_fresh_claim_reads_its_batch_by_key(any_ledger: str) -> None:
    """``claim_fresh`` on a backlog the statistics have not seen (5,000 pending
    deliveries queued since ANALYZE, or never analyzed), half of them fresh and half
    retried (an attempt each): it reads the due jobs in claim order up to the batch,
    looks each delivery, its attempts and its job up by key, and claims the fresh
    half of the batch."""
    found = _analyzed(
        any_ledger,
        "claim_fresh",
        FRESH,
        b"UPDATE kirim_jobs SET status = 'queued' WHERE id <= 5000",
        b"UPDATE kirim_deliveries SET status = 'pending' WHERE id <= 5000",
        b"DELETE FROM kirim_attempts WHERE delivery_id <= 5000 AND delivery_id % 2 = 0",
        PLAN_BY_INDEX,
    )
    nodes = _nodes(found["Plan"])
    assert found["Plan"]["Actual Rows"] == len(BATCH) // 2, json.dumps(found, indent=1)
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], json.dumps(found, indent=1)
    rescanned = [n for n in nodes if n["Node Type"] == "CTE Scan" and n["Actual Loops"] > 1]
    assert rescanned == [], json.dumps(found, indent=1)
    read = [
        (n.get("Relation Name"), n["Actual Rows"] * n["Actual Loops"])
        for n in nodes
        if n.get("Relation Name", "").startswith("kirim_")
    ]
    assert read, json.dumps(found, indent=1)
    assert all(rows <= len(BATCH) for _, rows in read), read


#: the careful transitions' statements (transitions._read, then its writes)
CAREFUL = (
    "lock_jobs",
    "lock_deliveries",
    "attempts_of_deliveries",
    "write_attempts",
    "write_jobs",
    "write_deliveries",
    "write_message_ids",
)


@pytest.mark.parametrize("name", CAREFUL)
def test_a_careful_transition_reads_by_key(any_ledger: str, name: str) -> None:
    """After ``plan_by_index`` (the careful transitions' first statement), no statement
    scans a table or reads more of its rows than the batch names, whatever the
    statistics say."""
    found = _analyzed(any_ledger, name, READ_ONCE[name], PLAN_BY_INDEX)
    nodes = _nodes(found["Plan"])
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], json.dumps(found, indent=1)
    read = [
        (n.get("Relation Name"), n["Actual Rows"] + n.get("Rows Removed by Filter", 0))
        for n in nodes
        if n.get("Relation Name", "").startswith("kirim_")
    ]
    assert all(rows <= 2 * len(BATCH) for _, rows in read), read
