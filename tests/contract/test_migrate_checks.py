"""Migration 0019, status checks a row's write pays nothing for: SQLite's schema names
no list of three constants or more in a CHECK or an index's predicate (SQLite built a
temporary B-tree of such a list for every row a statement run per row wrote), and each
check and the index of the active jobs accept exactly what they accepted."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from test_migrate import _dialect, _sql, at_version, cli
from test_migrate_lean_jobs import ROWS
from test_retention import rows

from kirim.model import AttemptStatus, DeliveryStatus, Doubt, JobStatus

#: ``column IN (constants)`` (or ``NOT IN``) in a schema's text
LIST = re.compile(r"(\w+)\s+(NOT\s+)?IN\s*\(([^()]*)\)", re.IGNORECASE)


def _schema(url: str) -> dict[str, str]:
    """SQLite's schema text: name -> its CREATE statement."""
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        found = conn.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL")
        return {str(name): str(sql) for name, sql in found}
    finally:
        conn.close()


def _long_lists(sql: str) -> list[tuple[str, list[str], re.Match[str]]]:
    """Each list of three constants or more: (its column, the constants as written)."""
    found = []
    for match in LIST.finditer(sql):
        values = [v.strip() for v in match.group(3).replace("\n", " ").split(",")]
        if len(values) >= 3:
            found.append((match.group(1), values, match))
    return found


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'kirim.db'}"


def test_sqlite_schema_names_no_list_of_three_constants(sqlite_url: str) -> None:
    """A CHECK or a partial index naming ``x IN ('a', 'b', 'c')`` cost every row a
    statement run per row wrote 2 to 3.5 us (bench/check_lists.py): none is left."""
    assert cli(sqlite_url, "migrate").exit_code == 0
    found = {
        name: [column for column, _, _ in _long_lists(sql)]
        for name, sql in _schema(sqlite_url).items()
        if _long_lists(sql)
    }
    assert found == {}


def test_each_sqlite_check_accepts_what_it_accepted(sqlite_url: str) -> None:
    """Schema 18's text with each such list written as a chain of ``=`` joined by OR is
    schema 19's, word for word; and the chain says what the list said of every constant
    of it, of another value and of NULL."""
    at_version(sqlite_url, 18)
    before = _schema(sqlite_url)
    assert cli(sqlite_url, "migrate").exit_code == 0
    after = _schema(sqlite_url)
    probe = sqlite3.connect(":memory:")
    rewritten = 0
    for name, sql in before.items():
        if not sql.startswith("CREATE TABLE"):
            continue
        expected = sql
        for column, values, match in _long_lists(sql):
            chain = " OR ".join(f"{column} = {value}" for value in values)
            expected = expected.replace(match.group(0), chain)
            rewritten += 1
            for candidate in [*(v.strip("'") for v in values), "bogus", "", None]:
                said = probe.execute(
                    f"SELECT {match.group(0)}, {chain} FROM (SELECT ? AS {column})", [candidate]
                ).fetchone()
                assert said[0] == said[1], (name, column, candidate)
        assert after[name] == expected, name
    assert rewritten == 9  # deliveries' status and doubt, and seven more tables' status


@pytest.mark.parametrize(
    ("table", "column", "allowed"),
    [
        ("kirim_deliveries", "status", [str(s) for s in DeliveryStatus]),
        ("kirim_deliveries", "doubt", [str(d) for d in Doubt]),
        ("kirim_jobs", "status", [str(s) for s in JobStatus]),
        ("kirim_attempts", "status", [str(s) for s in AttemptStatus]),
    ],
)
def test_the_ledgers_checks_accept_the_models_values_and_no_other(
    database_url: str, table: str, column: str, allowed: list[str]
) -> None:
    """Every value of the model's enum is written, another one is refused (both
    backends, the migrated schema)."""
    assert cli(database_url, "migrate").exit_code == 0
    _sql(database_url, ROWS)
    for value in allowed:
        _sql(database_url, [f"UPDATE {table} SET {column} = '{value}' WHERE id = 1"])
        assert rows(database_url, f"SELECT {column} FROM {table} WHERE id = 1") == [(value,)]
    with pytest.raises(Exception, match=r"(?i)check"):
        _sql(database_url, [f"UPDATE {table} SET {column} = 'bogus' WHERE id = 1"])


def test_a_delivery_has_one_active_job(database_url: str) -> None:
    """The index of the active jobs refuses a second queued, running or retry_scheduled
    job for a delivery, and takes one beside its completed and dead ones (a populated
    ledger of schema 18, migrated)."""
    at_version(database_url, 18)
    _sql(database_url, ROWS)  # delivery 2 has queued job 3; delivery 1 a dead and a completed
    assert cli(database_url, "migrate").exit_code == 0
    insert = (
        "INSERT INTO kirim_jobs (id, delivery_id, status, run_at, max_attempts, created_at,"
        " updated_at) VALUES ({id}, {delivery}, '{status}', 1.0, 3, 1.0, 1.0)"
    )
    for status in ("queued", "running", "retry_scheduled"):
        with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
            _sql(database_url, [insert.format(id=10, delivery=2, status=status)])
    _sql(database_url, [insert.format(id=11, delivery=1, status="retry_scheduled")])
    for status in ("queued", "running"):
        with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
            _sql(database_url, [insert.format(id=12, delivery=1, status=status)])
    _sql(database_url, [insert.format(id=13, delivery=2, status="dead")])
    assert rows(database_url, "SELECT COUNT(*) FROM kirim_jobs") == [(6,)]
    if _dialect(database_url) == "sqlite":
        check = sqlite3.connect(database_url.removeprefix("sqlite:///"))
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        check.close()
