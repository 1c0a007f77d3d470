"""`kirim doctor` on real databases of each backend, with the bad situations made for real."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kirim.cli import main
from kirim.config import Config, parse_config
from kirim.doctor.audit import audit_table
from kirim.doctor.checks import diagnose
from kirim.doctor.probes import Database
from kirim.errors import NotFound
from kirim.model import OnUnknown
from kirim.store import open_store
from kirim.store.sqlite import sqlite_path
from kirim.testing import FlakyProvider
from kirim.worker import WorkerSettings

LEASE = 10.0


@contextmanager
def raw(url: str) -> Iterator[Any]:
    """A plain autocommit connection, to set up what kirim itself would never write."""
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(sqlite_path(url)[0], isolation_level=None)
    else:
        import psycopg

        conn = psycopg.connect(url, autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


def checks_of(url: str, config: Config, now: float) -> dict[str, Any]:
    with Database(url) as db:
        return {c.name: c for c in diagnose(db, config, now=now)}


def config_for(url: str, **worker: Any) -> Config:
    return parse_config({"database": url, "worker": {"lease": 30, **worker}})


def doctor_cli(tmp_path: Path, *args: str) -> tuple[int, str]:
    config = tmp_path / "doctor.toml"
    config.write_text("")
    done = CliRunner().invoke(main, ["--config", str(config), "doctor", *args])
    return done.exit_code, done.stdout if "--json" in args else done.output


async def test_a_healthy_store_has_no_problem(make_app, database_url, clock) -> None:
    """A fresh store with one delivery sent: every check ok or skipped."""
    app = await make_app(FlakyProvider())
    await app.notify("e", "u", "push", {})
    await app.worker().run_once()
    found = checks_of(database_url, config_for(database_url), clock.now())
    assert {c.status for c in found.values()} <= {"ok", "skipped"}, found
    assert found["unique_idempotency_key"].status == "ok"
    assert "kirim_deliveries_key" in found["unique_idempotency_key"].message
    assert "duplicates" not in found


async def test_missing_unique_index_and_its_duplicates_are_problems(
    make_app, database_url, clock, tmp_path
) -> None:
    """Without the UNIQUE index on the key, the doctor says so, gives the index, lists dups."""
    await make_app()
    with raw(database_url) as db:
        db.execute("DROP INDEX kirim_deliveries_key")
        for _ in range(3):
            db.execute(
                "INSERT INTO kirim_deliveries (idempotency_key, event_id, recipient, channel, "
                "payload, payload_hash, status, created_at, updated_at) "
                "VALUES ('order-1', 'e', 'u', 'push', '{}', 'h', 'sent', 0, 0)"
            )
    found = checks_of(database_url, config_for(database_url), clock.now())
    unique = found["unique_idempotency_key"]
    assert unique.status == "problem"
    assert "CREATE UNIQUE INDEX kirim_deliveries_idempotency_key_key ON kirim_deliveries" in (
        unique.fix
    )
    assert unique.fix.endswith("(idempotency_key)") or "(idempotency_key) (on a busy" in unique.fix
    assert "remove the duplicates first" in unique.fix
    assert found["duplicates"].status == "problem"
    assert "idempotency_key='order-1' (3 rows)" in found["duplicates"].message
    code, output = doctor_cli(tmp_path, "--dsn", database_url, "--json")
    report = json.loads(output)
    assert code == 1
    assert report["ok"] is False
    assert {c["name"] for c in report["checks"] if c["status"] == "problem"} == {
        "unique_idempotency_key",
        "duplicates",
    }


async def test_an_expired_claim_nobody_reaps_is_stuck(make_app, database_url, clock) -> None:
    """A claim made in the past and never renewed or reaped: stuck in processing."""
    app = await make_app()
    n = await app.notify("e", "u", "push", {})
    await app.store.claim(worker_id="gone", now=clock.now(), lease=LEASE, limit=1)
    config = config_for(database_url)
    live = checks_of(database_url, config, clock.now() + 5)
    assert live["stuck_processing"].status == "ok"  # the lease still holds
    found = checks_of(database_url, config, clock.now() + LEASE + 31)
    stuck = found["stuck_processing"]
    assert stuck.status == "problem"
    assert f"(ids {n.delivery_id})" in stuck.message
    assert "no active job" not in stuck.message
    assert "kirim worker" in stuck.fix


async def test_a_processing_delivery_without_a_job_is_named(make_app, database_url, clock) -> None:
    """A processing delivery whose job ended (a hand-edited row) is stuck with no job."""
    app = await make_app()
    n = await app.notify("e", "u", "push", {})
    await app.store.claim(worker_id="gone", now=clock.now(), lease=LEASE, limit=1)
    with raw(database_url) as db:
        db.execute("UPDATE kirim_jobs SET status = 'completed'")
    found = checks_of(database_url, config_for(database_url), clock.now() + 3600)
    stuck = found["stuck_processing"]
    assert stuck.status == "problem"
    assert f"no active job at all, which no worker will finish (ids {n.delivery_id})" in (
        stuck.message
    )
    assert "kirim cancel ID" in stuck.fix


async def test_held_deliveries_are_in_doubt_and_dead_lettered(
    make_app, database_url, clock
) -> None:
    """A delivery parked in doubt waits for an operator: two warnings, no problem."""
    app = await make_app(
        FlakyProvider(idempotent=False, script=["accept_then_timeout"]), on_unknown=OnUnknown.HOLD
    )
    n = await app.notify("e", "u", "push", {})
    await app.worker().run_once()
    found = checks_of(database_url, config_for(database_url), clock.now())
    assert found["in_doubt"].status == "warning"
    assert "1 delivery in doubt" in found["in_doubt"].message
    assert f"(ids {n.delivery_id})" in found["in_doubt"].message
    assert "kirim dead-letter retry ID" in found["in_doubt"].fix
    assert found["dead_letters"].status == "warning"
    assert found["dead_letters"].message.startswith("1 delivery dead-lettered")
    assert not [c for c in found.values() if c.status == "problem"]


async def test_a_lease_shorter_than_the_latency_p99_is_a_warning(
    make_app, database_url, clock
) -> None:
    """Requests that took 40 s against a 30 s lease: raise the lease to twice the p99."""

    async def slow(_message: Any) -> None:
        clock.advance(40)

    app = await make_app(FlakyProvider(on_request=slow))
    worker = app.worker(settings=WorkerSettings(lease=30, concurrency=1))
    for i in range(3):
        await app.notify(f"e{i}", "u", "push", {})
        await worker.run_once()
    found = checks_of(database_url, config_for(database_url), clock.now())
    check = found["lease_vs_latency"]
    assert check.status == "warning"
    assert "p99 40.000 s over the last 3 attempts" in check.message
    assert "lease = 80" in check.fix
    longer = checks_of(database_url, config_for(database_url, lease=60), clock.now())
    assert longer["lease_vs_latency"].status == "ok"


async def test_clock_skew_is_measured_on_postgresql_only(make_app, database_url, clock) -> None:
    """PostgreSQL's clock is compared with this host's; SQLite shares it and is skipped."""
    await make_app()
    check = checks_of(database_url, config_for(database_url), clock.now())["clock_skew"]
    if database_url.startswith("sqlite:"):
        assert check.status == "skipped"
        assert "SQLite" in check.message
    else:
        assert check.status == "ok"  # the server runs on this host
        assert check.message.startswith("database clock ")


async def test_a_database_without_the_schema_says_kirim_init(database_url, clock) -> None:
    """No kirim schema: one problem naming `kirim init`; the store checks are skipped."""
    store = open_store(database_url)
    await store.open()  # creates the SQLite file, writes no table
    await store.close()
    found = checks_of(database_url, config_for(database_url), clock.now())
    assert found["schema"].status == "problem"
    assert found["schema"].fix == "run `kirim init`"
    assert found["store"].status == "skipped"
    assert "stuck_processing" not in found


@pytest.fixture
def orders(database_url: str) -> str:
    """Someone else's delivery table, with no unique index and one duplicated key."""
    with raw(database_url) as db:
        db.execute(
            "CREATE TABLE outbox (id integer PRIMARY KEY, event_id text NOT NULL, "
            "user_id text NOT NULL, channel text NOT NULL, note text)"
        )
        for i, (event, user) in enumerate([("e1", "u1"), ("e1", "u1"), ("e2", "u1")]):
            db.execute(
                f"INSERT INTO outbox (id, event_id, user_id, channel) "
                f"VALUES ({i + 1}, '{event}', '{user}', 'push')"
            )
    return database_url


def test_a_table_without_a_unique_key_gets_the_create_index(orders, tmp_path) -> None:
    """--table/--key on a table with no unique index: exit 1, the fix and the duplicates."""
    code, output = doctor_cli(
        tmp_path, "--dsn", orders, "--table", "outbox", "--key", "event_id,user_id,channel"
    )
    assert code == 1
    assert "CREATE UNIQUE INDEX outbox_event_id_user_id_channel_key ON outbox " in output
    assert "(event_id, user_id, channel)" in output
    assert "event_id='e1', user_id='u1', channel='push' (2 rows)" in output
    assert "2 problems, 0 warnings" in output


def test_a_unique_index_in_another_column_order_covers_the_key(orders, tmp_path) -> None:
    """The columns of the index may come in any order."""
    with raw(orders) as db:
        db.execute("DELETE FROM outbox WHERE id = 2")
        db.execute("CREATE UNIQUE INDEX outbox_key ON outbox (channel, user_id, event_id)")
    code, output = doctor_cli(
        tmp_path, "--dsn", orders, "--table", "outbox", "--key", "event_id, user_id, channel"
    )
    assert code == 0, output
    report = json.loads(
        doctor_cli(
            tmp_path,
            "--dsn",
            orders,
            "--table",
            "outbox",
            "--key",
            "user_id,channel,event_id",
            "--json",
        )[1]
    )
    assert report["ok"] is True
    assert report["checks"] == [
        {
            "name": "unique_key",
            "status": "ok",
            "message": "outbox (user_id, channel, event_id) is unique: unique index outbox_key",
            "fix": None,
        }
    ]


def test_a_unique_constraint_counts_as_the_key(orders) -> None:
    """A table-level UNIQUE constraint is as good as a unique index."""
    with raw(orders) as db:
        db.execute(
            "CREATE TABLE sends (id integer PRIMARY KEY, k text NOT NULL, CONSTRAINT sends_k "
            "UNIQUE (k))"
        )
    with Database(orders) as db:
        (check,) = audit_table(db, "sends", "k")
    assert check.status == "ok"


def test_a_partial_unique_index_does_not_count(orders) -> None:
    """A unique index with a WHERE clause guarantees nothing for the other rows."""
    with raw(orders) as db:
        db.execute("DELETE FROM outbox WHERE id = 2")
        db.execute(
            "CREATE UNIQUE INDEX outbox_recent ON outbox (event_id, user_id) WHERE note IS NULL"
        )
    with Database(orders) as db:
        unique, duplicates = audit_table(db, "outbox", "event_id,user_id")
    assert unique.status == "problem"
    assert "outbox_recent is partial" in unique.message
    assert (duplicates.status, duplicates.message) == (
        "ok",
        "no duplicate outbox (event_id, user_id) so far",
    )


def test_a_stricter_unique_index_and_nullable_keys_are_warnings(orders) -> None:
    """Unique on fewer columns: no duplicate can exist, but say so; NULL keys escape an index."""
    with raw(orders) as db:
        db.execute("CREATE TABLE t2 (id integer PRIMARY KEY, a text NOT NULL, b text)")
        db.execute("CREATE UNIQUE INDEX t2_a ON t2 (a)")
        db.execute("CREATE TABLE t3 (id integer PRIMARY KEY, a text NOT NULL, b text)")
        db.execute("CREATE UNIQUE INDEX t3_ab ON t3 (b, a)")
    with Database(orders) as db:
        (stricter,) = audit_table(db, "t2", "a,b")
        ok, nullable = audit_table(db, "t3", "a,b")
    assert stricter.status == "warning"
    assert "t2_a makes (a) unique" in stricter.message
    assert ok.status == "ok"
    assert (nullable.name, nullable.status) == ("unique_key_not_null", "warning")
    assert nullable.message.startswith("b may be NULL")


def test_unknown_tables_and_columns_are_usage_errors(orders, tmp_path) -> None:
    """A table or column that does not exist exits 2 and lists the columns."""
    with Database(orders) as db, pytest.raises(NotFound, match="no table 'nope'"):
        audit_table(db, "nope", "a")
    code, output = doctor_cli(tmp_path, "--dsn", orders, "--table", "outbox", "--key", "event")
    assert code == 2
    assert "outbox has no column 'event' (columns: id, event_id, user_id, channel, note)" in output
