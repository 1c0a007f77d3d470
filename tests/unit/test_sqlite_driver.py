"""The SQLite driver's statements run per record: named parameters bound by position."""

from __future__ import annotations

import sqlite3

import pytest

from kirim.store.sequence import Query
from kirim.store.sqlite import driver
from kirim.store.sqlite.driver import execute, positional


def test_named_parameters_are_numbered_once_each_in_order() -> None:
    """Each name gets the next number the first time it appears, and the same number
    every time it recurs; the picker gives a record's values in that order."""
    numbered, pick = positional("UPDATE t SET a = :a, b = :b WHERE id = :id AND a <> :a")
    assert numbered == "UPDATE t SET a = ?1, b = ?2 WHERE id = ?3 AND a <> ?1"
    assert pick({"id": 7, "b": "y", "a": "x"}) == ("x", "y", 7)


def test_literals_comments_and_casts_are_left_alone() -> None:
    """A colon inside a string literal or a comment, or after another colon, is no
    parameter."""
    sql = "SELECT ':x', 'it''s :y' -- :z\nFROM t WHERE a = :a AND b = c::text"
    numbered, pick = positional(sql)
    assert numbered == "SELECT ':x', 'it''s :y' -- :z\nFROM t WHERE a = ?1 AND b = c::text"
    assert pick({"a": 1}) == (1,)


def test_a_statement_without_parameters_binds_none() -> None:
    numbered, pick = positional("DELETE FROM t")
    assert (numbered, pick({"a": 1})) == ("DELETE FROM t", ())


@pytest.fixture
def conn() -> sqlite3.Connection:
    c = sqlite3.connect(":memory:")
    c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT, b TEXT)")
    c.executemany("INSERT INTO t (id) VALUES (?)", [(1,), (2,)])
    return c


def test_a_statement_run_per_record_writes_each_record(
    conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every record's values land in its own row, the step's other arguments in all."""
    monkeypatch.setitem(driver.Q, "t_write", "UPDATE t SET a = :a, b = :b WHERE id = :id")
    items = [{"id": 2, "a": "two"}, {"id": 1, "a": "one"}]
    assert execute(conn, Query("t_write", {"items": items, "b": "both"}, count=True)) == 2
    rows = conn.execute("SELECT id, a, b FROM t ORDER BY id").fetchall()
    assert rows == [(1, "one", "both"), (2, "two", "both")]


def test_a_record_without_a_parameter_is_sqlite3s_error(
    conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing value is the error sqlite3 gives for it, naming the parameter."""
    monkeypatch.setitem(driver.Q, "t_write", "UPDATE t SET a = :a WHERE id = :id")
    with pytest.raises(sqlite3.ProgrammingError, match="id"):
        execute(conn, Query("t_write", {"items": [{"a": "x"}]}, count=True))


def test_rows_read_are_dicts_by_column_name(
    conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statement's rows come back as dicts by column name, as PostgreSQL's driver
    gives them (a name looked up in one probe, not sqlite3.Row's scan of the columns)."""
    conn.row_factory = sqlite3.Row  # the driver's connection has it; its reads do not
    monkeypatch.setitem(driver.Q, "t_read", "SELECT id, a FROM t WHERE id = :id")
    rows = execute(conn, Query("t_read", {"id": 2}))
    assert rows == [{"id": 2, "a": None}]
    assert type(rows[0]) is dict


def test_a_name_that_recurs_keeps_its_first_column(
    conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two columns of one name: the first one's value, as sqlite3.Row gives, in the
    columns' order."""
    monkeypatch.setitem(driver.Q, "t_read", "SELECT 1 AS x, 2 AS a, 3 AS x, 4 AS b")
    (row,) = execute(conn, Query("t_read"))
    assert row == {"x": 1, "a": 2, "b": 4}
    assert list(row) == ["x", "a", "b"]


def test_a_statement_that_reads_no_columns_gives_no_rows(
    conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statement without result columns run as a read gives an empty list."""
    monkeypatch.setitem(driver.Q, "t_read", "UPDATE t SET a = 'z' WHERE id = 1")
    assert execute(conn, Query("t_read")) == []
    assert conn.execute("SELECT a FROM t WHERE id = 1").fetchone() == ("z",)
