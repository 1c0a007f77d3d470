"""Migration 0018, leaner job and attempt writes, on both backends: PostgreSQL's attempts
no longer reference their job by a foreign key (nor keep its index), its jobs and
attempts keep room on their pages, and a populated ledger of schema 17 migrates with
retention still deleting a delivery's attempts with its jobs; SQLite keeps its key."""

from __future__ import annotations

import asyncio

import pytest
from test_migrate import _dialect, _sql, at_version, cli
from test_migrate_lean import _indexes
from test_retention import rows

from kirim.store import open_store

DAY = 86_400.0

#: a ledger of schema 17: a sent delivery whose first job died and whose operator's
#: retry made a second job (an attempt of each), one still queued, and a newer sent one
#: (the rows holding the newest ids always stay: prune keeps them)
ROWS = [
    "INSERT INTO kirim_deliveries (id, idempotency_key, event_id, recipient, channel, payload,"
    " payload_hash, status, provider_message_id, created_at, updated_at, sent_at) VALUES"
    " (1, 'k-1', 'e-1', 'r', 'push', '{}', 'h', 'sent', 'm-1', 1.0, 2.0, 2.0),"
    " (2, 'k-2', 'e-2', 'r', 'push', '{}', 'h', 'pending', NULL, 1.0, 1.0, NULL),"
    " (3, 'k-3', 'e-3', 'r', 'push', '{}', 'h', 'sent', 'm-3', 3.0, 4.0, 4.0)",
    "INSERT INTO kirim_jobs (id, delivery_id, status, run_at, attempts, max_attempts,"
    " created_at, updated_at) VALUES (1, 1, 'dead', 1.0, 1, 1, 1.0, 1.5),"
    " (2, 1, 'completed', 1.6, 1, 1, 1.6, 2.0), (3, 2, 'queued', 1.0, 0, 3, 1.0, 1.0),"
    " (4, 3, 'completed', 3.0, 1, 3, 3.0, 4.0)",
    "INSERT INTO kirim_attempts (delivery_id, job_id, number, provider_request_id, worker_id,"
    " status, provider_message_id, requested_at, completed_at) VALUES"
    " (1, 1, 1, 'q-1', 'w', 'failed_permanent', NULL, 1.0, 1.5),"
    " (1, 2, 1, 'q-2', 'w', 'succeeded', 'm-1', 1.7, 1.8),"
    " (3, 4, 1, 'q-3', 'w', 'succeeded', 'm-3', 3.5, 3.6)",
]

#: attempts whose job is not a job of their own delivery
ORPHANS = (
    "SELECT a.id FROM kirim_attempts a WHERE NOT EXISTS"
    " (SELECT 1 FROM kirim_jobs j WHERE j.id = a.job_id AND j.delivery_id = a.delivery_id)"
)


def _keys(url: str) -> list[tuple[str, str]]:
    """The attempts' foreign keys: (the column, the table it references)."""
    if _dialect(url) == "sqlite":
        found = rows(url, 'SELECT "from", "table" FROM pragma_foreign_key_list(\'kirim_attempts\')')
        return sorted((str(c), str(t)) for c, t in found)
    found = rows(
        url,
        "SELECT a.attname, c.confrelid::regclass::text FROM pg_constraint c"
        " JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)"
        " WHERE c.contype = 'f' AND c.conrelid = 'kirim_attempts'::regclass",
    )
    return sorted((str(c), str(t)) for c, t in found)


def test_postgres_attempts_name_their_job_without_a_key(database_url: str) -> None:
    """PostgreSQL: no foreign key from the attempts to the jobs (an intent locked its job
    to check it) and no index of the attempts by job; SQLite keeps both (dropping a key
    rebuilds the table)."""
    assert cli(database_url, "migrate").exit_code == 0
    indexes = _indexes(database_url)
    if _dialect(database_url) == "sqlite":
        assert _keys(database_url) == [
            ("delivery_id", "kirim_deliveries"),
            ("job_id", "kirim_jobs"),
        ]
        assert "kirim_attempts_job" in indexes
    else:
        assert _keys(database_url) == []
        assert "kirim_attempts_job" not in indexes


def test_postgres_jobs_and_attempts_keep_room_for_their_updates(database_url: str) -> None:
    """PostgreSQL: a job's claim and finish write their versions on its own page, and an
    attempt's finish on its own (fillfactor 40), the deliveries as 0013 left them."""
    if _dialect(database_url) == "sqlite":
        pytest.skip("fillfactor: PostgreSQL only")
    assert cli(database_url, "migrate").exit_code == 0
    options = dict(
        rows(
            database_url,
            "SELECT relname, reloptions FROM pg_class"
            " WHERE relname IN ('kirim_deliveries', 'kirim_jobs', 'kirim_attempts')",
        )
    )
    assert options == {
        "kirim_deliveries": ["fillfactor=45"],
        "kirim_jobs": ["fillfactor=40"],
        "kirim_attempts": ["fillfactor=40"],
    }


def test_a_populated_ledger_of_schema_17_migrates_and_prunes_attempts_with_their_jobs(
    database_url: str,
) -> None:
    """The rows stay as they were; prune then deletes the sent delivery with both its jobs
    and both its attempts, and leaves no attempt whose job is gone."""
    at_version(database_url, 17)
    _sql(database_url, ROWS)
    assert cli(database_url, "migrate").exit_code == 0
    assert rows(database_url, "SELECT id, job_id FROM kirim_attempts ORDER BY id") == [
        (1, 1),
        (2, 2),
        (3, 4),
    ]

    async def go() -> tuple[int, int, int]:
        store = open_store(database_url)
        await store.open()
        try:
            done = await store.prune(now=4.0 + 31 * DAY, keep=30 * DAY, keys=365 * DAY)
            return done.deliveries, done.jobs, done.attempts
        finally:
            await store.close()

    assert asyncio.run(go()) == (1, 2, 2)
    assert rows(database_url, "SELECT id FROM kirim_jobs ORDER BY id") == [(3,), (4,)]
    assert rows(database_url, "SELECT id, job_id FROM kirim_attempts") == [(3, 4)]
    assert rows(database_url, ORPHANS) == []
