"""An UPDATE run per record that sets only the columns whose values changed (SQLite).

The transitions write back rows they read in the same transaction (``Query.read``):
a claim changes five of a delivery's eleven written columns, a finish seven. SQLite
pays for every column a SET names, changed or not (each is bound, the new record is
built from them, and an index on a named column is checked), so a record is written
by the named query with its SET cut down to the columns that differ from the row as
read. The records are grouped by that set of columns, one statement per set, each
text made once (``narrowed``: cached by the set, told as one flag per assignment of
the clause, which C code compares and hashes faster than a set of names). The
WHERE, and with it every fence, is the named query's own; a record with no column
changed still runs it (a SET of one column to itself), so it is counted as before.

The ledger narrows the delivery's write-back only (``transitions.Ledger.writes``): a
job's changes its status every time, which four of the job's five indexes name, and
measured no faster with fewer columns (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import operator
import re
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: the SET clause of a named UPDATE (up to its WHERE)
_SET = re.compile(r"\bSET\b(.*?)\bWHERE\b", re.S)
#: one plain assignment of it: ``column = :parameter``
_ASSIGNMENT = re.compile(r"\s*(\w+)\s*=\s*:(\w+)\s*")

Positional = Callable[[str], tuple[str, Callable[[Mapping[str, Any]], tuple[Any, ...]]]]


@dataclass(frozen=True, slots=True)
class Assignments:
    """The SET clause of a named UPDATE: its ``(column, parameter)`` pairs, and what
    picks their values out of a record (by parameter) and out of a row (by column)."""

    pairs: tuple[tuple[str, str], ...]
    new: Callable[[Mapping[str, Any]], tuple[Any, ...]]
    old: Callable[[Mapping[str, Any]], tuple[Any, ...]]


@functools.cache
def assignments(sql: str) -> Assignments:
    """The assignments of the SET clause of ``sql``; ValueError for an UPDATE whose SET
    is not a list of plain ``column = :parameter``."""
    found = _SET.search(sql)
    if found is None:
        raise ValueError(f"not an UPDATE with SET … WHERE: {sql!r}")
    pairs = []
    for part in found.group(1).split(","):
        plain = _ASSIGNMENT.fullmatch(part)
        if plain is None:
            raise ValueError(f"not a plain assignment (column = :parameter): {part!r}")
        pairs.append((plain.group(1), plain.group(2)))
    return Assignments(
        pairs=tuple(pairs),
        new=_picker([p for _, p in pairs]),
        old=_picker([c for c, _ in pairs]),
    )


def _picker(names: Sequence[str]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """The values of ``names`` in a mapping, as a tuple (``itemgetter``: in C)."""
    if len(names) == 1:
        only = names[0]
        return lambda m: (m[only],)
    return operator.itemgetter(*names)


#: which of a SET clause's assignments a record changes, in the clause's order
Changed = tuple[bool, ...]


@functools.cache
def narrowed(sql: str, columns: Changed) -> str:
    """``sql`` setting only the ``columns`` changed (none: its first column, to
    itself)."""
    found = _SET.search(sql)
    assert found is not None  # ``assignments`` checked it
    pairs = assignments(sql).pairs
    first = pairs[0][0]
    kept = ", ".join(f"{c} = :{p}" for (c, p), x in zip(pairs, columns, strict=True) if x)
    return f"{sql[: found.start(1)]} {kept or f'{first} = {first}'}\n{sql[found.end(1) :]}"


def changed(set_: Assignments, record: Mapping[str, Any], row: Mapping[str, Any] | None) -> Changed:
    """Which columns ``record`` gives another value than ``row`` has (every one where
    the row was not read)."""
    if row is None:
        return (True,) * len(set_.pairs)
    return tuple(map(operator.ne, set_.new(record), set_.old(row)))


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
    set_ = assignments(sql)
    groups: dict[Changed, list[Mapping[str, Any]]] = {}
    for record, row in zip(records, read, strict=True):
        groups.setdefault(changed(set_, record, row), []).append(record)
    count = 0
    for columns, group in groups.items():
        numbered, pick = positional(narrowed(sql, columns))
        count += conn.executemany(numbered, [pick(r) for r in group]).rowcount
    return count
