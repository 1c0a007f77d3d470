"""An UPDATE run per record that sets only the columns whose values changed (SQLite).

The transitions write back rows they read in the same transaction (``Query.read``):
a claim changes five of a delivery's eleven written columns, a finish seven. SQLite
pays for every column a SET names, changed or not (each is bound, the new record is
built from them, and an index on a named column is checked), so a record is written
by the named query with its SET cut down to the columns that differ from the row as
read. The records are grouped by that set of columns, one statement per set, each
text made once (``narrowed``: cached by the set). The WHERE, and with it every fence,
is the named query's own; a record with no column changed still runs it (a SET of
one column to itself), so it is counted as before.
"""

from __future__ import annotations

import functools
import re
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: the SET clause of a named UPDATE (up to its WHERE)
_SET = re.compile(r"\bSET\b(.*?)\bWHERE\b", re.S)
#: one plain assignment of it: ``column = :parameter``
_ASSIGNMENT = re.compile(r"\s*(\w+)\s*=\s*:(\w+)\s*")

Positional = Callable[[str], tuple[str, Callable[[Mapping[str, Any]], tuple[Any, ...]]]]


@functools.cache
def assignments(sql: str) -> tuple[tuple[str, str], ...]:
    """The ``(column, parameter)`` pairs of the SET clause of ``sql``; ValueError for
    an UPDATE whose SET is not a list of plain ``column = :parameter``."""
    found = _SET.search(sql)
    if found is None:
        raise ValueError(f"not an UPDATE with SET … WHERE: {sql!r}")
    pairs = []
    for part in found.group(1).split(","):
        plain = _ASSIGNMENT.fullmatch(part)
        if plain is None:
            raise ValueError(f"not a plain assignment (column = :parameter): {part!r}")
        pairs.append((plain.group(1), plain.group(2)))
    return tuple(pairs)


@functools.cache
def narrowed(sql: str, columns: frozenset[str]) -> str:
    """``sql`` setting only ``columns`` (all none: its first column, to itself)."""
    found = _SET.search(sql)
    assert found is not None  # ``assignments`` checked it
    pairs = assignments(sql)
    first = pairs[0][0]
    kept = ", ".join(f"{c} = :{p}" for c, p in pairs if c in columns) or f"{first} = {first}"
    return f"{sql[: found.start(1)]} {kept}\n{sql[found.end(1) :]}"


def changed(
    pairs: Sequence[tuple[str, str]], record: Mapping[str, Any], row: Mapping[str, Any] | None
) -> frozenset[str]:
    """The columns ``record`` gives another value than ``row`` has (every one where the
    row was not read)."""
    if row is None:
        return frozenset(c for c, _ in pairs)
    return frozenset(c for c, p in pairs if record[p] != row[c])


def write_changed(
    conn: sqlite3.Connection,
    sql: str,
    records: Sequence[Mapping[str, Any]],
    read: Sequence[Mapping[str, Any] | None],
    positional: Positional,
) -> int:
    """Run ``sql`` for each record, setting only its changed columns; the rows changed."""
    if len(read) != len(records):
        raise ValueError(f"{len(records)} records written over {len(read)} rows read")
    pairs = assignments(sql)
    groups: dict[frozenset[str], list[Mapping[str, Any]]] = {}
    for record, row in zip(records, read, strict=True):
        groups.setdefault(changed(pairs, record, row), []).append(record)
    count = 0
    for columns, group in groups.items():
        numbered, pick = positional(narrowed(sql, columns))
        count += conn.executemany(numbered, [pick(r) for r in group]).rowcount
    return count
