"""Migration 0013, the lean ledger, on both backends: a ledger of schema 11 with rows
in it migrates, its callbacks still find their deliveries by every message id they had,
and no index of the ledger names a column that the hot path (claim, intent, finish)
changes, so that PostgreSQL updates those rows in place (HOT)."""

from __future__ import annotations

import asyncio
import re
import sqlite3

import pytest
from test_migrate import _dialect, _sql, at_version, cli

from kirim.model import CallbackStatus, DeliveryStatus
from kirim.store import open_store
from kirim.store.base import Callback, CallbackOutcome

#: what a claim, an intent's finish or a finish writes, per table
HOT_COLUMNS = {
    "kirim_deliveries": {
        "status",
        "doubt",
        "claim_token",
        "claimed_by",
        "claim_expires_at",
        "provider_message_id",
        "last_error",
        "sent_at",
        "released_at",
        "reason",
        "updated_at",
    },
    "kirim_attempts": {"status", "provider_message_id", "error", "completed_at"},
}

#: a ledger of schema 11: a sent delivery with a message id no attempt has (an operator's
#: reconcile found it) whose second request got its own, one whose only message id is an
#: attempt's, and one never sent
ROWS = [
    "INSERT INTO kirim_deliveries (id, idempotency_key, event_id, recipient, channel, payload,"
    " payload_hash, status, provider_message_id, created_at, updated_at, sent_at) VALUES"
    " (1, 'k-1', 'e-1', 'r', 'push', '{}', 'h', 'sent', 'm-1', 1.0, 2.0, 2.0),"
    " (2, 'k-2', 'e-2', 'r', 'push', '{}', 'h', 'in_doubt', NULL, 1.0, 2.0, NULL),"
    " (3, 'k-3', 'e-3', 'r', 'push', '{}', 'h', 'pending', NULL, 1.0, 1.0, NULL)",
    "INSERT INTO kirim_jobs (id, delivery_id, status, run_at, attempts, max_attempts,"
    " created_at, updated_at) VALUES (1, 1, 'completed', 1.0, 2, 3, 1.0, 2.0),"
    " (2, 2, 'dead', 1.0, 1, 1, 1.0, 2.0), (3, 3, 'queued', 1.0, 0, 3, 1.0, 1.0)",
    "INSERT INTO kirim_attempts (delivery_id, job_id, number, provider_request_id, worker_id,"
    " status, provider_message_id, requested_at, completed_at) VALUES"
    " (1, 1, 1, 'q-1', 'w', 'unknown', NULL, 1.0, 1.5),"
    " (1, 1, 2, 'q-2', 'w', 'succeeded', 'm-1b', 1.6, 1.7),"
    " (2, 2, 1, 'q-3', 'w', 'unknown', 'm-2', 1.0, 1.5)",
]


def _indexes(url: str) -> dict[str, tuple[str, str]]:
    """Every index of the ledger's tables: name -> (table, its definition)."""
    if _dialect(url) == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            found = {}
            for name, table, sql in conn.execute(
                "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index'"
            ):
                cols = [r[2] for r in conn.execute(f"PRAGMA index_info('{name}')")]
                found[name] = (table, f"{' '.join(c for c in cols if c)} {sql or ''}")
            return found
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT indexrelid::regclass::text, indrelid::regclass::text,"
            " pg_get_indexdef(indexrelid) FROM pg_index"
        ).fetchall()
    return {name: (table, definition) for name, table, definition in rows}


def test_no_index_of_the_ledger_names_a_column_the_hot_path_changes(database_url: str) -> None:
    """Not in its columns, nor in a partial index's predicate: either stops PostgreSQL's
    in-place (HOT) updates of the delivery and its attempts."""
    assert cli(database_url, "migrate").exit_code == 0
    named = {}
    for name, (table, definition) in _indexes(database_url).items():
        words = set(re.findall(r"\w+", definition.split(" ON ", 1)[-1]))
        if hits := words & HOT_COLUMNS.get(table, set()):
            named[name] = sorted(hits)
    assert named == {}


def test_the_ledger_keeps_room_for_updates_in_place(database_url: str) -> None:
    """PostgreSQL: the deliveries and attempts leave room on each page for the versions
    their updates write (fillfactor; the attempts' as 0018 left it), and the attempts
    have no foreign key to the deliveries."""
    if _dialect(database_url) == "sqlite":
        pytest.skip("fillfactor: PostgreSQL only")
    import psycopg

    assert cli(database_url, "migrate").exit_code == 0
    with psycopg.connect(database_url) as conn:
        options = dict(
            conn.execute(
                "SELECT relname, reloptions FROM pg_class"
                " WHERE relname IN ('kirim_deliveries', 'kirim_attempts')"
            ).fetchall()
        )
        keys = conn.execute(
            "SELECT conname FROM pg_constraint WHERE contype = 'f'"
            " AND conrelid = 'kirim_attempts'::regclass"
            " AND confrelid = 'kirim_deliveries'::regclass"
        ).fetchall()
    assert options == {
        "kirim_deliveries": ["fillfactor=45"],
        "kirim_attempts": ["fillfactor=40"],
    }
    assert keys == []


def test_a_populated_ledger_of_schema_11_migrates_and_callbacks_find_every_message_id(
    database_url: str,
) -> None:
    """The side table is filled from the rows as they were: a callback finds a delivery
    by its own message id, by a second request's, and by an attempt's only; a message id
    nobody recorded is kept, as before."""
    at_version(database_url, 11)
    _sql(database_url, ROWS)
    assert cli(database_url, "migrate").exit_code == 0

    async def go() -> list[tuple[CallbackOutcome, int | None, DeliveryStatus | None]]:
        store = open_store(database_url)
        await store.open()
        try:
            out = []
            for message_id in ("m-1", "m-1b", "m-2", "m-none"):
                cb = Callback(
                    channel="push",
                    message_id=message_id,
                    status=CallbackStatus.DELIVERED,
                    now=10.0,
                )
                r = await store.confirm(cb)
                out.append((r.outcome, r.delivery_id, r.status))
            return out
        finally:
            await store.close()

    found = asyncio.run(go())
    assert [(outcome, delivery) for outcome, delivery, _ in found] == [
        (CallbackOutcome.APPLIED, 1),
        (CallbackOutcome.RECORDED, 1),
        (CallbackOutcome.APPLIED, 2),
        (CallbackOutcome.UNKNOWN, None),
    ]
    assert found[0][2] is DeliveryStatus.DELIVERED
