"""Runs a store ``Operation`` (``kirim.store.sequence``) on one SQLite connection, in
the transaction its caller opened, on the store's own thread."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any, TypeVar

from kirim.store.sequence import At, Operation, Query
from kirim.store.sqlfiles import load_queries

T = TypeVar("T")
Q = load_queries("sqlite")


def bind(args: Mapping[str, Any]) -> dict[str, Any]:
    """A set (a list of ids or records) is one JSON parameter (``json_each``)."""
    return {k: json.dumps(v) if isinstance(v, list | tuple) else v for k, v in args.items()}


def execute(conn: sqlite3.Connection, step: Query) -> Any:
    sql = Q.get(step.name)
    if sql is None:
        if step.optional:
            return 0 if step.count else []
        raise KeyError(f"SQLite has no query named {step.name!r}")
    items = step.args.get("items")
    if items is not None and ":items" not in sql:
        # one run per record (executemany), each with the step's other arguments too
        rest = {k: v for k, v in step.args.items() if k != "items"}
        rows = [{**rest, **item} for item in items] if rest else items
        cursor = conn.executemany(sql, rows)
        if not step.count:
            raise ValueError(f"{step.name}: a statement run per record returns no rows")
        return cursor.rowcount
    cursor = conn.execute(sql, bind(step.args))
    return cursor.rowcount if step.count else cursor.fetchall()


def drive(op: Operation[T], conn: sqlite3.Connection, at: At) -> T:
    """Answer each step of ``op`` until it returns; ``at``: the time of record."""
    answer: Any = None
    try:
        while True:
            step = op.send(answer)
            if isinstance(step, Query):
                answer = execute(conn, step)
            elif isinstance(step, tuple):
                answer = [execute(conn, q) for q in step]
            else:
                answer = at
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
