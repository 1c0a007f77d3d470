"""kirim's transactions run at READ COMMITTED, whatever the server's default says.

The protocol's fences rely on it: a fenced ``UPDATE`` or a row lock that waited for a
concurrent writer checks its condition again on the row that writer left (READ
COMMITTED's re-check), where REPEATABLE READ and SERIALIZABLE raise "could not
serialize access due to concurrent update" instead. A database, role or server whose
``default_transaction_isolation`` is one of those (some teams set it for their own
applications) made an operator's verb fail when it met a worker's write, and the
worker's finishes fail and retry. Checked here: every write of the ledger, by
triggers that record ``current_setting('transaction_isolation')``; each of the
driver's ways to run an operation; and the race itself. The sessions of these
databases start at SERIALIZABLE (the URL's ``options``). Through a pooler:
tests/contract/test_postgres_pooler.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
from test_notify_postgres import waiting
from test_postgres_jit import TABLES, audited, deliver_three, open_app, seen, setting_in_force

from kirim.engine import Kirim
from kirim.model import DeliveryStatus
from kirim.store.postgres.driver import Q
from kirim.store.sequence import Query

READ_COMMITTED = "read committed"


@pytest.fixture
def database_url(request: pytest.FixtureRequest) -> str:
    """A fresh database whose sessions start at SERIALIZABLE (the URL's options)."""
    from pg import fresh_database

    return fresh_database(request) + "?options=-c%20default_transaction_isolation%3Dserializable"


@pytest.fixture
async def app(database_url: str) -> AsyncIterator[Kirim]:
    kirim = await open_app(database_url)
    yield kirim
    await kirim.close()


def isolation_in_force(monkeypatch: pytest.MonkeyPatch) -> Callable[[], Any]:
    """An operation that reads the isolation level in force where the driver runs it."""
    return setting_in_force(monkeypatch, "transaction_isolation")


async def test_the_sessions_of_this_test_start_serializable(database_url: str) -> None:
    """What the other tests rely on: without kirim, a transaction here is SERIALIZABLE."""
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute("SELECT current_setting('transaction_isolation')")
        assert await cur.fetchone() == ("serializable",)


async def test_every_write_of_a_delivery_runs_at_read_committed(
    app: Kirim, database_url: str
) -> None:
    """Intake, claim, intent, finish (plain and careful: one request refused for now,
    retried) and the retry's claim: every statement that wrote the ledger ran at READ
    COMMITTED, though each session starts at SERIALIZABLE."""
    await audited(database_url, "transaction_isolation")
    await deliver_three(app)
    found = await seen(database_url)
    assert {t for t, _, _ in found} == set(TABLES)  # every table of the hot path audited
    assert [s for s in found if s[2] != READ_COMMITTED] == []


@pytest.mark.parametrize(
    ("way", "level"),
    [
        ("write", READ_COMMITTED),
        ("snapshot", "repeatable read"),
        ("alone", READ_COMMITTED),
        ("read", "serializable"),
    ],
)
async def test_the_driver_runs_its_transactions_and_its_statements_alone_at_read_committed(
    app: Kirim, monkeypatch: pytest.MonkeyPatch, way: str, level: str
) -> None:
    """A write transaction and ``run_alone`` (a batch's intents, its plain finish) run
    at READ COMMITTED; a read of several statements at REPEATABLE READ (one snapshot,
    read only); a read of one statement in autocommit with the session's level (one
    statement reads one snapshot at any level, and writes nothing)."""
    op = isolation_in_force(monkeypatch)
    driver: Any = app.store.driver  # type: ignore[attr-defined]
    assert driver.direct  # run_alone's autocommit path (through a pooler: a transaction)
    if way == "alone":
        found = await driver.run_alone(op())
    else:
        found = await driver.run(op(), write=way == "write", snapshot=way == "snapshot")
    assert found == level


async def test_an_operators_cancel_that_waited_for_another_writer_is_answered(
    app: Kirim, database_url: str
) -> None:
    """The race the level decides: a cancel whose transaction waits for a concurrent
    writer of the delivery (here a plain UPDATE held open; in life a worker's claim or a
    callback) goes on when that writer commits, and reads the row it left. At
    SERIALIZABLE it failed with "could not serialize access"."""
    made = await app.notify("e", "u1", "push", {"n": 1}, key="k1")
    async with await psycopg.AsyncConnection.connect(database_url) as holder:
        await holder.execute(
            "UPDATE kirim_deliveries SET updated_at = updated_at + 1 WHERE id = %s",
            (made.delivery_id,),
        )
        cancel = await waiting(database_url, app.cancel("k1"))
        await holder.commit()
    after = await asyncio.wait_for(cancel, 30)
    assert after.delivery.status is DeliveryStatus.CANCELED


async def test_a_read_of_several_statements_reads_one_snapshot(
    app: Kirim, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read the store makes "in one snapshot" (a record: its delivery, then its job
    and attempts; a feed page and its counts; the dashboard's counts) sees no commit
    that lands between its statements: at READ COMMITTED each statement read a snapshot
    of its own, and a record read while a worker finished could show the delivery
    ``processing`` beside its succeeded attempt. A write between the two statements
    (from another connection, committed) is not seen by the second."""
    made = await app.notify("e", "u1", "push", {"n": 1}, key="k1")
    monkeypatch.setitem(Q, "test_status", "SELECT status FROM kirim_deliveries WHERE id = %(id)s")

    def op(to: str) -> Any:
        [before] = yield Query("test_status", {"id": made.delivery_id})
        with psycopg.connect(database_url, autocommit=True) as other:
            other.execute(
                "UPDATE kirim_deliveries SET status = %s WHERE id = %s", (to, made.delivery_id)
            )
        [after] = yield Query("test_status", {"id": made.delivery_id})
        return before["status"], after["status"]

    driver: Any = app.store.driver  # type: ignore[attr-defined]
    assert await driver.run(op("canceled"), write=False, snapshot=True) == ("pending", "pending")
    # a write transaction reads what is committed as it goes (READ COMMITTED)
    assert await driver.run(op("failed"), write=True) == ("canceled", "failed")
