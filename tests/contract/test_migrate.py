"""``kirim migrate`` (``--check``, ``--dry-run``) and the refusal of a schema newer than
this kirim knows, on both backends.

A database "of an older kirim" is made here by applying the first migrations as
written (the SQL files), with the schema version they leave; one "of a newer kirim"
by raising the recorded version past ``SCHEMA_VERSION``.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from kirim.cli import main
from kirim.config import Config
from kirim.engine import Kirim
from kirim.errors import SchemaError
from kirim.store import open_store
from kirim.store.base import SCHEMA_VERSION
from kirim.store.migrations import OlderWorkers, all_of
from kirim.store.sqlfiles import load_queries, migrations
from kirim.store.sqlite.driver import _statements

#: docs/upgrading.md, which three tests below hold to the code
UPGRADING = Path(__file__).resolve().parents[2] / "docs" / "upgrading.md"


def _sql(url: str, statements: list[str]) -> None:
    """Run ``statements`` on the database itself, outside kirim."""
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            for s in statements:
                conn.execute(s)
        finally:
            conn.close()
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for s in statements:
            conn.execute(s.encode())  # bytes: no placeholders


def _dialect(url: str) -> str:
    return "sqlite" if url.startswith("sqlite:") else "postgres"


def at_version(url: str, version: int) -> None:
    """The database as a kirim of schema ``version`` left it. Each migration on its own
    connection: one that edits SQLite's schema text (``writable_schema``) is read again
    by the next connection, as the driver's schema cookie bump makes it (on the same
    connection, a later ALTER TABLE would write its column into the stale text)."""
    dialect = _dialect(url)
    _sql(url, [load_queries(dialect)["create_meta"]])
    for number, sql in migrations(dialect):
        if number <= version:
            _sql(url, _statements(sql) if dialect == "sqlite" else [sql])
    _sql(url, [f"INSERT INTO kirim_meta (key, value) VALUES ('schema_version', '{version}')"])


def set_version(url: str, version: int) -> None:
    _sql(url, [f"UPDATE kirim_meta SET value = '{version}' WHERE key = 'schema_version'"])


def version_of(url: str) -> int:
    async def go() -> int:
        store = open_store(url)
        await store.open()
        try:
            return await store.schema_version()
        finally:
            await store.close()

    return asyncio.run(go())


def cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--database", url, *args], catch_exceptions=False)


@pytest.fixture
def newer(database_url: str) -> str:
    """A database a newer kirim migrated: the current schema, its version one past."""
    assert cli(database_url, "migrate").exit_code == 0
    set_version(database_url, SCHEMA_VERSION + 1)
    return database_url


def test_check_and_dry_run_say_what_would_run_and_change_nothing(database_url: str) -> None:
    """On a database of schema 4, --check lists 5 to 7 with whether older workers may
    run on and exits 1, --dry-run prints their SQL too; neither changes the version,
    then migrate applies them and --check exits 0."""
    at_version(database_url, 4)
    check = cli(database_url, "migrate", "--check")
    assert check.exit_code == 1, check.output
    assert "schema version 4" in check.output
    for m in all_of(_dialect(database_url))[4:]:
        assert m.name in check.output
    assert "0004_retention" not in check.output
    assert "0006_attempt_provider  attempt provider (older workers may run on)" in check.output
    assert "stop every worker older than this kirim" in check.output
    assert "0007_notification_layer" in check.output.split("stop every worker")[1]
    dry = cli(database_url, "migrate", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "-- 0005_callbacks.sql" in dry.output
    assert "CREATE TABLE kirim_confirmations" in dry.output
    assert dry.output.rstrip().endswith("nothing was changed (--dry-run)")
    assert version_of(database_url) == 4
    applied = cli(database_url, "migrate")
    assert applied.exit_code == 0, applied.output
    assert f"applied; schema version {SCHEMA_VERSION}" in applied.output
    assert version_of(database_url) == SCHEMA_VERSION
    again = cli(database_url, "migrate", "--check")
    assert again.exit_code == 0, again.output
    assert "nothing to migrate" in again.output


def test_check_as_json(database_url: str) -> None:
    """--check --json gives the plan as one object: versions, each pending migration."""
    at_version(database_url, 6)
    import json

    done = cli(database_url, "migrate", "--check", "--json")
    assert done.exit_code == 1
    plan = json.loads(done.output)
    assert (plan["current"], plan["target"], plan["too_new"]) == (6, SCHEMA_VERSION, False)
    assert [p["name"] for p in plan["pending"]] == [
        "0007_notification_layer",
        "0008_truthful_records",
        "0009_recipient_addresses",
        "0010_inbox",
        "0011_feed_changes",
        "0012_topics",
        "0013_lean_ledger",
        "0014_workflows",
        "0015_record_retention",
        "0016_topic_event_cancels",
        "0017_run_digests",
        "0018_lean_jobs",
        "0019_cheap_checks",
    ]
    assert plan["pending"][0]["older_workers"] == "stop"
    assert plan["stop_workers_first"] is True


def test_every_migration_says_whether_older_workers_may_run_on() -> None:
    """Each migration of both dialects has its upgrade line, and the two dialects agree."""
    sqlite, postgres = all_of("sqlite"), all_of("postgres")
    assert [m.version for m in sqlite] == list(range(1, SCHEMA_VERSION + 1))
    assert [(m.name, m.older_workers) for m in sqlite] == [
        (m.name, m.older_workers) for m in postgres
    ]
    assert all(m.why for m in sqlite)
    assert OlderWorkers.SAFE in {m.older_workers for m in sqlite}


#: every command that opens the store, with arguments it would accept
STORE_COMMANDS: list[list[str]] = [
    ["worker", "--burst"],
    ["send", "--event", "e-1", "--recipient", "1007", "--channel", "push", "--payload", "{}"],
    ["event", "order_shipped", "--event", "e-1", "--recipient", "1007"],
    ["status", "1"],
    ["list"],
    ["cancel", "1"],
    ["run", "show", "1"],
    ["run", "cancel", "1"],
    ["run", "list"],
    ["reconcile", "1"],
    ["dead-letter", "list"],
    ["dead-letter", "retry", "1"],
    ["dead-letter", "cancel", "1"],
    ["prune", "--keep", "30d"],
    ["prune", "--keep", "30d", "--dry-run"],
    ["token", "create", "--name", "ops"],
    ["token", "list"],
    ["token", "revoke", "ops"],
    ["prefs", "show", "1007"],
    ["prefs", "set", "1007", "--timezone", "Asia/Jakarta"],
    ["prefs", "clear", "1007"],
    ["addresses", "list", "1007"],
    ["addresses", "add", "1007", "push", "+15551230000"],
    ["addresses", "remove", "1007", "push", "+15551230000"],
    ["addresses", "retire", "push", "+15551230000"],
    ["topics", "subscribe", "project:42", "1007"],
    ["topics", "unsubscribe", "project:42", "1007"],
    ["topics", "list"],
    ["topics", "show", "project:42"],
    ["serve", "--port", "0"],
    ["init"],
    ["migrate"],
    ["migrate", "--check"],
    ["migrate", "--dry-run"],
    ["import-keys", "-"],
]
#: the commands that open no store of the configuration's (or only say what is wrong)
NO_STORE = {"render", "demo", "bench", "simulate", "explore", "analyze", "doctor"}


def _leaves(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from _leaves(command, (*prefix, name))
        elif command is not None:
            yield (*prefix, name)


def test_the_refusal_list_names_every_command_that_opens_the_store() -> None:
    """Every command of the click tree is in the list below or opens no store: a new
    command must be added to one of them."""
    tested = {tuple(a for a in args if not a.startswith("-"))[:2] for args in STORE_COMMANDS}
    for leaf in _leaves(main):
        if leaf[0] in NO_STORE:
            continue
        assert any(leaf == t[: len(leaf)] for t in tested), leaf


@pytest.mark.parametrize("args", STORE_COMMANDS, ids=" ".join)
def test_every_command_refuses_a_schema_newer_than_it_knows(newer: str, args: list[str]) -> None:
    """Against a database a newer kirim migrated, the command exits 2 saying so, and the
    database keeps its version (nothing was written)."""
    done = CliRunner().invoke(main, ["--database", newer, *args], input="k-1\n")
    assert done.exit_code == 2, done.output
    assert f"schema version {SCHEMA_VERSION + 1}" in done.output
    assert "a newer kirim migrated it" in done.output
    assert "upgrade kirim here" in done.output
    assert version_of(newer) == SCHEMA_VERSION + 1


def test_doctor_names_the_newer_schema(newer: str) -> None:
    """kirim doctor reports a schema newer than this kirim as a problem, with the fix."""
    done = cli(newer, "doctor")
    assert done.exit_code == 1, done.output
    assert "newer than this kirim" in done.output


async def test_the_python_api_refuses_a_newer_schema(newer: str) -> None:
    """Kirim.open raises SchemaError on a newer schema, with or without migrate."""
    for migrate in (False, True):
        app = Kirim(Config(database=newer))
        with pytest.raises(SchemaError, match="a newer kirim migrated it"):
            await app.open(migrate=migrate)
        await app.close()


def test_the_upgrading_guide_lists_every_migration_as_its_file_says() -> None:
    """docs/upgrading.md's table has one row per migration, with the safe or stop its SQL
    file gives."""
    doc = UPGRADING.read_text()
    rows = [line.split("|")[1:4] for line in doc.splitlines() if line.startswith("| ")]
    table = {cells[1].strip().strip("`"): cells[2].strip() for cells in rows[1:]}
    assert table == {m.name: str(m.older_workers) for m in all_of("sqlite")}


def test_the_upgrading_guide_names_this_kirims_schema_version() -> None:
    """docs/upgrading.md's "(N for this one)", its refusal example and its --check
    example name the schema version this kirim knows (they said 7 for two releases)."""
    doc = UPGRADING.read_text()
    assert f"({SCHEMA_VERSION} for this one)" in doc
    assert f"knows only up to {SCHEMA_VERSION}:" in doc
    assert re.findall(r"knows up to version (\d+)", doc) == [str(SCHEMA_VERSION)]


def test_the_upgrading_guides_check_example_is_what_the_command_prints(tmp_path: Path) -> None:
    """docs/upgrading.md's `kirim migrate --check` on a database of schema 9 is the
    command's output, line for line (it had drifted from the command's wrapping)."""
    doc = UPGRADING.read_text()
    found = re.search(r"```text\n(sqlite:///kirim\.db: schema version 9;.*?)```", doc, re.S)
    assert found is not None
    url = f"sqlite:///{tmp_path / 'kirim.db'}"
    at_version(url, 9)
    done = cli(url, "migrate", "--check")
    assert done.exit_code == 1
    assert done.output.replace(url, "sqlite:///kirim.db") == found.group(1)
