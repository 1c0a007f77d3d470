"""PostgreSQL's JIT is off for every unit of work kirim runs (``no_jit``, sql/queries.sql).

The JIT compiles a statement whose estimated cost passes ``jit_above_cost``; kirim's
batch statements passed it once a table held tens of thousands of rows with
statistics that lag, and a finish of 256 deliveries then spent 50 ms compiling for 5
of work (bench: 40,000 deliveries, 2 workers: server CPU 175 -> 74 us per delivery,
docs/benchmarks.md). What is checked here is where the setting holds: on the server,
by triggers that record ``current_setting('jit')`` at each write of the ledger, and by
a read through each of the driver's ways to run an operation. The database's own
setting is ``on`` for every connection (the URL's ``options``), whatever the server's
configuration says. (Through a pooler: tests/contract/test_postgres_pooler.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.store.postgres.driver import Q
from kirim.store.sequence import Query
from kirim.testing import FlakyProvider, ManualClock
from kirim.worker import Worker, WorkerSettings

TABLES = ("kirim_deliveries", "kirim_jobs", "kirim_attempts", "kirim_message_ids")


def audit_sql(setting: str) -> str:
    """A table and a trigger function that record ``current_setting(setting)`` at each
    write (``setting_seen``)."""
    return f"""
CREATE TABLE setting_seen (tbl text NOT NULL, op text NOT NULL, value text NOT NULL);
CREATE FUNCTION setting_seen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO setting_seen VALUES (TG_TABLE_NAME, TG_OP, current_setting('{setting}'));
    RETURN NULL;
END $$;
"""


@pytest.fixture
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database whose sessions start with the JIT on (the URL's options)."""
    from pg import fresh_database

    del tmp_path
    return fresh_database(request) + "?options=-c%20jit%3Don"


async def open_app(database_url: str) -> Kirim:
    """An app on ``database_url`` whose push provider answers ok, then transient."""
    provider = FlakyProvider(script=["ok", "transient"])
    kirim = Kirim(
        Config(database=database_url, max_attempts=3),
        channels={"push": Channel(name="push", provider=provider)},
        clock=ManualClock(1000.0),
    )
    return await kirim.open(migrate=True)


@pytest.fixture
async def app(database_url: str) -> AsyncIterator[Kirim]:
    kirim = await open_app(database_url)
    yield kirim
    await kirim.close()


def setting_in_force(monkeypatch: pytest.MonkeyPatch, setting: str) -> Callable[[], Any]:
    """An operation that reads ``setting`` as it is in force where the driver runs it (a
    query of the test's own, ``test_setting``)."""
    monkeypatch.setitem(Q, "test_setting", f"SELECT current_setting('{setting}') AS value")

    def op() -> Any:
        [row] = yield Query("test_setting")
        return row["value"]

    return op


def jit_in_force(monkeypatch: pytest.MonkeyPatch) -> Callable[[], Any]:
    """``setting_in_force`` of the JIT."""
    return setting_in_force(monkeypatch, "jit")


async def audited(database_url: str, setting: str) -> None:
    """Record ``setting`` at every write of the hot path's tables (``setting_seen``)."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(audit_sql(setting))
        for table in TABLES:
            await conn.execute(
                f"CREATE TRIGGER setting_seen AFTER INSERT OR UPDATE OR DELETE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION setting_seen()"
            )


async def seen(database_url: str) -> list[tuple[str, str, str]]:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute("SELECT tbl, op, value FROM setting_seen")
        return [tuple(r) for r in await cur.fetchall()]


async def deliver_three(app: Kirim) -> Worker:
    """Three notifications through a worker: one request refused for now and retried
    (the careful finish), the rest plain."""
    for i in range(3):
        await app.notify("e", f"u{i}", "push", {"n": i})
    settings = WorkerSettings(lease=30.0, backoff_base=0.0, backoff_max=0.0)
    worker = Worker(app.store, app.channels(), settings=settings, worker_id="w", clock=app.clock)
    for _ in range(4):
        await worker.run_once()
    assert (worker.stats.sent, worker.stats.retries) == (3, 1)
    return worker


async def test_every_write_of_a_delivery_runs_with_the_jit_off(
    app: Kirim, database_url: str
) -> None:
    """Intake, claim, intent, finish (plain and careful: one request refused for now,
    retried) and the retry's claim: every statement that wrote the ledger ran with the
    JIT off, though each session starts with it on."""
    await audited(database_url, "jit")
    await deliver_three(app)
    found = await seen(database_url)
    assert {t for t, _, _ in found} == set(TABLES)  # every table of the hot path audited
    assert {("kirim_jobs", "UPDATE"), ("kirim_attempts", "INSERT")} <= {(t, o) for t, o, _ in found}
    assert [s for s in found if s[2] != "off"] == []


@pytest.mark.parametrize(
    ("way", "jit"), [("write", "off"), ("snapshot", "off"), ("alone", "off"), ("read", "on")]
)
async def test_the_driver_turns_the_jit_off_in_its_transactions_and_alone(
    app: Kirim, monkeypatch: pytest.MonkeyPatch, way: str, jit: str
) -> None:
    """A transaction (a write, a read of several statements in one snapshot) and
    ``run_alone`` (a batch's intents, its plain finish) run their statements with the
    JIT off; a read of one statement in autocommit (one round trip, no setting sent
    with it) runs with the session's."""
    op = jit_in_force(monkeypatch)
    driver: Any = app.store.driver  # type: ignore[attr-defined]
    assert driver.direct  # run_alone's one round trip (through a pooler: test_postgres_pooler)
    if way == "alone":
        found = await driver.run_alone(op())
    else:
        found = await driver.run(op(), write=way == "write", snapshot=way == "snapshot")
    assert found == jit


async def test_a_callers_transaction_keeps_its_own_setting(
    app: Kirim, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the application's own transaction (``run_in``: an enqueue with the app's
    writes) kirim sets nothing: the caller's later statements would inherit it."""
    op = jit_in_force(monkeypatch)
    driver: Any = app.store.driver  # type: ignore[attr-defined]
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        assert await driver.run_in(conn, op()) == "on"
        cur = await conn.execute("SELECT current_setting('jit')")
        assert (await cur.fetchone()) == ("on",)
