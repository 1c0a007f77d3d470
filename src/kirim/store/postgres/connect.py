"""Connecting to PostgreSQL: the URL, one first attempt, and a session kept empty.

``postgres_conninfo`` turns kirim's URL into libpq's (kirim's own ``pool_*``
parameters taken out); ``probe`` makes one connection attempt before the pool opens
and finds the route it took (``kirim.store.pooler``); ``configure`` prepares each pool
connection without leaving anything in its session (``SESSIONLESS``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow

from kirim.errors import ConfigError
from kirim.store.pooler import CLIENT_PORT, Route, route
from kirim.store.postgres.arrays import FlatListBinaryDumper
from kirim.text import libpq_encode, libpq_query, scrub
from kirim.text import redact_url as redact

Conn = psycopg.AsyncConnection[DictRow]

#: The store keeps nothing in a database session, so that it works through a pooler
#: in transaction mode (PgBouncer's ``pool_mode = transaction``), where each
#: transaction may run on another server connection, shared with other clients. So no
#: server-side prepared statements: psycopg prepares a query after 5 executions by
#: default, as ``_pg3_<n>`` in the server session, and a later execution by that name
#: would run on a server connection that does not have it (an error), or that has
#: another client's ``_pg3_<n>``: another query, run with our parameters. Every
#: statement is then planned with its parameters (unnamed statements get custom
#: plans), which the batch statements need: a generic plan does not know how many rows
#: their arrays hold.
SESSIONLESS: dict[str, Any] = {"prepare_threshold": None}
_POOL_PARAMS = {"pool_min_size": 1, "pool_max_size": 10}


def postgres_conninfo(url: str) -> tuple[str, dict[str, int]]:
    """``postgres[ql]://…`` → a libpq URI without kirim's own ``pool_*`` parameters.

    The query is read as libpq reads it (percent-decoding only: ``+`` is a plus) and
    an empty authority keeps its ``//`` (``postgresql:///db?host=/run/postgresql``)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"not a PostgreSQL URL: {redact(url)!r} (expected postgresql://host/db)")
    pool = dict(_POOL_PARAMS)
    query = []
    for key, value in libpq_query(parts.query):
        if key in pool:
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"{key} must be a positive integer, not {value!r}")
            pool[key] = int(value)
        else:
            query.append((key, value))
    if pool["pool_min_size"] > pool["pool_max_size"]:
        raise ConfigError("pool_min_size must not be larger than pool_max_size")
    encoded = f"?{libpq_encode(query)}" if query else ""
    return f"postgresql://{parts.netloc}{parts.path}{encoded}", pool


async def probe(conninfo: str, url: str, *, wait: float, listen: bool) -> Route | None:
    """One connection attempt, not the pool's retries until its timeout (the URL's
    ``connect_timeout``, else ``wait`` seconds), so that a missing server or database is one
    ``ConfigError``; the route it took (a pooler in front?), None when the server would
    not say. ``listen``: ``url`` is ``listen_url`` (for the message)."""
    try:
        given = "connect_timeout" in conninfo_to_dict(conninfo)
        limit: dict[str, Any] = {} if given else {"connect_timeout": max(2, round(wait))}
        conn = await psycopg.AsyncConnection.connect(conninfo, **SESSIONLESS, **limit)
    except psycopg.Error as exc:
        why = scrub(" ".join(str(exc).split()), url) or type(exc).__name__
        which = "database URL (--database, KIRIM_DATABASE_URL or the config's database)"
        if listen:
            which = "listen_url (the config's listen_url or KIRIM_LISTEN_URL)"
        raise ConfigError(
            f"PostgreSQL: cannot connect to {redact(url)}: {why}; check the {which}"
        ) from None
    try:
        seen = (await (await conn.execute(CLIENT_PORT)).fetchone() or (None,))[0]
        return route(conn.pgconn.socket, seen)
    except psycopg.Error:
        return None
    finally:
        await conn.close()


async def configure(conn: Conn) -> None:
    """Lists (the batch columns) are sent as binary arrays: several times cheaper to dump
    than quoted text, and a flat list of one type is packed in a few C calls
    (``arrays.FlatListBinaryDumper``). Every transaction psycopg begins on it says its
    level, READ COMMITTED (``BEGIN ISOLATION LEVEL READ COMMITTED``: see
    ``ISOLATION``). Nothing is set in the session (see ``SESSIONLESS``)."""
    conn.adapters.register_dumper(list, FlatListBinaryDumper)
    await conn.set_isolation_level(ISOLATION)


#: The level of every transaction kirim runs, whatever the server's, the database's or
#: the role's ``default_transaction_isolation`` says. The protocol's fences rely on
#: it: a fenced ``UPDATE`` or a row lock that waited for a concurrent writer checks its
#: condition again on the row that writer left; at REPEATABLE READ or SERIALIZABLE it
#: fails instead ("could not serialize access due to concurrent update"): an operator's
#: verb that met a worker's write failed, a finish was retried. Sent in each ``BEGIN``
#: (no round trip of its own, nothing left in a pooler's shared session); a statement
#: run alone in autocommit runs at the session's level, so the driver runs it in a
#: transaction where that level is another (``session_reads_committed``).
ISOLATION = psycopg.IsolationLevel.READ_COMMITTED


async def session_reads_committed(conn: Conn) -> bool:
    """Whether a statement run in autocommit on ``conn`` runs at READ COMMITTED (its
    session's ``default_transaction_isolation``, set by the server's configuration, the
    database's, the role's or the URL's ``options``)."""
    cur = await conn.execute("SHOW default_transaction_isolation")
    row = await cur.fetchone()
    return row is not None and row["default_transaction_isolation"] == "read committed"
