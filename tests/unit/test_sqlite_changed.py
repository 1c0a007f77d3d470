"""SQLite's narrowed write-backs (``kirim.store.sqlite.changed``): the SET cut down to
the changed columns, the rest of the statement as the named query has it."""

from __future__ import annotations

import pytest

from kirim.store.sqlite.changed import assignments, changed, narrowed
from kirim.store.sqlite.driver import Q

SQL = "UPDATE t\nSET a = :a, b = :new_b,\n    c = :c\nWHERE id = :id AND token = :token"


def test_the_assignments_are_read_from_the_set_clause() -> None:
    """Each ``column = :parameter`` of the SET, in order."""
    assert assignments(SQL).pairs == (("a", "a"), ("b", "new_b"), ("c", "c"))


def test_the_delivery_write_back_is_plain_assignments() -> None:
    """The named query SQLite narrows names every column the ledger writes back."""
    assert {c for c, _ in assignments(Q["write_deliveries"]).pairs} == {
        "status", "doubt", "claim_token", "claimed_by", "claim_expires_at",
        "provider_message_id", "last_error", "sent_at", "released_at", "reason", "updated_at",
    }  # fmt: skip


def test_a_set_that_is_not_plain_is_refused() -> None:
    """An assignment of an expression cannot be compared with the row read."""
    with pytest.raises(ValueError, match="not a plain assignment"):
        assignments("UPDATE t SET n = n + 1, a = :a WHERE id = :id")
    with pytest.raises(ValueError, match="SET"):
        assignments("DELETE FROM t WHERE id = :id")


def test_narrowed_keeps_the_where_as_it_is() -> None:
    """Only the SET changes; the fence (the WHERE) is the named query's own text."""
    text = narrowed(SQL, (False, True, False))
    assert text.startswith("UPDATE t\nSET b = :new_b\n")
    assert text.endswith("WHERE id = :id AND token = :token")


def test_nothing_changed_sets_a_column_to_itself() -> None:
    """A record that changes nothing still runs the statement (its WHERE counts it)."""
    assert "SET a = a\n" in narrowed(SQL, (False, False, False))


def test_changed_compares_each_value_with_the_row_read() -> None:
    """A value that differs, NULL written over a value included; every column when
    the row was not read."""
    record = {"a": 1, "new_b": None, "c": "x", "id": 7, "token": "t"}
    assert changed(assignments(SQL), record, {"a": 1, "b": "old", "c": "x"}) == (
        False, True, False,
    )  # fmt: skip
    assert changed(assignments(SQL), record, None) == (True, True, True)
