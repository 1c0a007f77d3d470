"""Runs a store ``Operation`` (``kirim.store.sequence``) on one psycopg cursor, inside
the transaction its caller opened."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from psycopg import AsyncCursor
from psycopg.rows import DictRow

from kirim.clock import Clock
from kirim.store.sequence import At, Group, Operation, Query, callers_time, fixed_time
from kirim.store.sqlfiles import load_queries

T = TypeVar("T")
Q = load_queries("postgres")
Cursor = AsyncCursor[DictRow]


def bind(args: Mapping[str, Any]) -> dict[str, Any]:
    """A list of records (``items``) is one array per column, ``i_<column>`` (unnest);
    arrays are sent binary (see ``_configure`` of the store), cheaper than JSON."""
    out = {}
    for key, value in args.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            for column in value[0]:
                out[f"i_{column}"] = [item[column] for item in value]
        else:
            out[key] = value
    return out


# -- one named query on a cursor (the stores' reads and the intake) ---------------


async def rows(
    cur: Cursor, name: str, args: Mapping[str, Any] | None = None, *, prepare: bool | None = None
) -> list[DictRow]:
    await cur.execute(Q[name], args, prepare=prepare)
    return await cur.fetchall() if cur.description is not None else []


async def one(cur: Cursor, name: str, args: Mapping[str, Any] | None = None) -> DictRow | None:
    await cur.execute(Q[name], args)
    return await cur.fetchone()


async def run(cur: Cursor, name: str, args: Mapping[str, Any]) -> int:
    await cur.execute(Q[name], args)
    return cur.rowcount


# -- operations -------------------------------------------------------------------


async def execute(cur: Cursor, step: Query) -> Any:
    sql = Q.get(step.name)
    if sql is None:
        if step.optional:
            return 0 if step.count else []
        raise KeyError(f"PostgreSQL has no query named {step.name!r}")
    await cur.execute(sql, bind(step.args))
    if step.count:
        return cur.rowcount
    return await cur.fetchall() if cur.description is not None else []


async def together(cur: Cursor, steps: Group) -> list[Any]:
    """Run statements in one pipeline: sent at once, one round trip for them all (a
    result per statement, in order)."""
    if len(steps) <= 1:
        return [await execute(cur, q) for q in steps]
    conn = cur.connection
    async with conn.pipeline() as pipeline:
        cursors: list[Cursor | None] = []
        for q in steps:
            if q.name not in Q:
                if not q.optional:
                    raise KeyError(f"PostgreSQL has no query named {q.name!r}")
                cursors.append(None)
                continue
            c = conn.cursor(row_factory=cur.row_factory)
            await c.execute(Q[q.name], bind(q.args))
            cursors.append(c)
        await pipeline.sync()
        out: list[Any] = []
        for q, done in zip(steps, cursors, strict=True):
            if done is None:
                out.append(0 if q.count else [])
            elif q.count:
                out.append(done.rowcount)
            else:
                out.append(await done.fetchall() if done.description is not None else [])
    return out


async def time_of_record(cur: Cursor, time: Clock | str | None) -> At:
    """``at`` for one transaction: the callers' own times, the given clock read once, or
    the database's clock (``kirim_now()``, with the simulated offset) read once."""
    if time is None:
        return callers_time
    if time == "database":
        await cur.execute(Q["store_now"], {"now": None})
        row = await cur.fetchone()
        assert row is not None
        t = float(row["now"])
    else:
        assert not isinstance(time, str)
        t = float(time.now())
    return fixed_time(t)


_NOW = Query("store_now", {"now": None})


async def drive(op: Operation[T], cur: Cursor, time: Clock | str | None) -> T:
    """Answer each step of ``op`` until it returns. On the database's clock, the first
    group of statements also reads the time (after them: after their locks), so that a
    later ``TIME`` costs no round trip of its own."""
    answer: Any = None
    read: float | None = None
    try:
        while True:
            step = op.send(answer)
            if isinstance(step, Query):
                answer = await execute(cur, step)
            elif isinstance(step, tuple):
                if time == "database" and read is None:
                    *answer, rows = await together(cur, (*step, _NOW))
                    read = float(rows[0]["now"])
                else:
                    answer = await together(cur, step)
            elif read is not None:
                answer = fixed_time(read)
            else:
                answer = await time_of_record(cur, time)
                read = answer(0.0) if time == "database" else None
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
