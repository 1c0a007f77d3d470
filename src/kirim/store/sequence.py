"""A store operation written once, run by either backend.

An operation (``transitions``) is a generator: it yields data-access steps and gets
their results back, and decides everything else itself, in plain Python, with the
rules of ``rules``. A backend's driver runs it inside one transaction of its own and
answers each step from its own ``sql/`` files:

- ``Query(name, args)``: run the dialect's named query; the result is its rows (a
  mapping by column name each), or, with ``count=True``, the number of rows changed.
  A list argument is a set: a list of ids, or ``items``, a list of records (each a
  dict of column values); the dialect reads it as one parameter (SQLite:
  ``json_each``; PostgreSQL: ``ANY`` of an array, or ``jsonb_to_recordset``), so one
  statement handles a whole batch.
- ``Query(..., read=rows)``: a write of ``items`` over rows the operation read in
  this transaction, ``rows`` being those rows as read, one per item (None where one
  was not read): a dialect may set only the columns whose values differ (SQLite:
  ``kirim.store.sqlite.changed``), with the statement's WHERE as it is.
- ``Query(..., optional=True)``: a step only some dialects need (PostgreSQL's row
  locks and wake-ups: SQLite holds the database's write lock for the whole
  transaction and its workers poll); a dialect without the query skips it.
- a tuple of ``Query``: statements that do not depend on each other's results, in
  order; the result is the list of their results. A driver may send them together
  (PostgreSQL: in one pipeline, one round trip); each still runs after the one before
  it, so a read after a lock sees what the lock waited for.
- ``TIME``: the result is ``at``, a function of a caller's ``now`` that gives the
  store's time of record (``StoreTime``): the caller's own time, the database's
  clock read once for the transaction, or a given clock's.
- ``Now(given)``: the value to pass as a statement's ``now``: the time of record as
  a number, or None where the dialect's statements read the database's clock
  themselves (PostgreSQL's ``kirim_now(NULL)``), which costs no round trip of its own.

So a rule cannot live in one backend only: the SQL only reads and writes rows (and
fences a write by a token where one statement does both), and every decision about
what follows what is made here, once.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

T = TypeVar("T")

#: The store's time of record for a caller's ``now`` (see ``TIME``).
At = Callable[[float], float]


def callers_time(now: float) -> float:
    """``at`` of a store whose time of record is each caller's own ``now``."""
    return float(now)


def fixed_time(t: float) -> At:
    """``at`` of a transaction that read one clock once: ``t``, whatever the caller's."""
    return lambda _now: t


@dataclass(frozen=True, slots=True)
class Query:
    """Run one named query of the dialect's ``sql/`` files."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    #: the result is the number of rows changed, not the rows
    count: bool = False
    #: a dialect that has no query of this name skips the step (its result: no rows)
    optional: bool = False
    #: the rows ``items`` write over, as read, one per item (see the module's text)
    read: Sequence[Mapping[str, Any] | None] | None = None


class _Time:
    """Ask the driver for ``at`` (see ``TIME``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "TIME"


TIME: Final = _Time()


@dataclass(frozen=True, slots=True)
class Now:
    """Ask the driver for a statement's ``now`` argument (see the module's text)."""

    given: float


#: Statements sent together (see the module's text).
Group = tuple[Query, ...]

#: An operation: yields steps, receives their results, returns its answer.
Operation = Generator[Query | Group | _Time | Now, Any, T]
