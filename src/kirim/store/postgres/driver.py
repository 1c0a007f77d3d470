"""The PostgreSQL driver: psycopg 3 async on a connection pool, for many worker hosts.

It runs store operations (``kirim.store.sequence``) on a pool connection: statements
a step sends together go in one pipeline (one round trip); a read of one statement
runs in autocommit (a transaction of its own, one round trip). Transactions and the
statements run alone begin with the JIT off (``NO_JIT``). Batch claims lease due
jobs with ``FOR NO KEY UPDATE SKIP LOCKED``; intents, heartbeats and the common
outcomes are one statement per batch (``sql/transitions.sql``).

Its capabilities beyond the common driver: LISTEN/NOTIFY wake-ups (``listens``) and
operations inside the application's own transaction (``enqueues_in``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncCursor
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from kirim.errors import ConfigError, SchemaError, StoreError
from kirim.store.base import SCHEMA_VERSION, Intent, StoreTime
from kirim.store.pooler import Wakeups
from kirim.store.schema import check_version, parse_version, too_new
from kirim.store.sequence import At, Group, Now, Operation, Query, callers_time, fixed_time
from kirim.store.sqlfiles import load_queries, migrations

T = TypeVar("T")
Q = load_queries("postgres")
Cursor = AsyncCursor[DictRow]


def bind(args: Mapping[str, Any]) -> dict[str, Any]:
    """A list of records (``items``) is one array per column, ``i_<column>`` (unnest);
    arrays are sent binary (see ``connect.configure``), cheaper than JSON."""
    out = {}
    for key, value in args.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            for column in value[0]:
                out[f"i_{column}"] = [item[column] for item in value]
        else:
            out[key] = value
    return out


async def rows(cur: Cursor, name: str, args: Mapping[str, Any] | None = None) -> list[DictRow]:
    """One named query's rows (the ledger's check and the migrations)."""
    await cur.execute(Q[name], args)
    return await cur.fetchall() if cur.description is not None else []


#: statements that set the transaction's own settings (``SET LOCAL``): not run in a
#: caller's transaction (``run_in``), whose later statements would inherit them
SETS_LOCAL = frozenset({"plan_by_index"})
#: sent with the first statement of a transaction, and of a statement run alone
#: (``drive``'s ``lead``): the JIT off for it (``sql/queries.sql``, ``no_jit``)
NO_JIT = (Query("no_jit"),)
#: ... and a read of several statements (``run``'s ``snapshot``) reads one snapshot
#: (``sql/queries.sql``, ``one_snapshot``), said before the JIT's setting reads
ONE_SNAPSHOT = (Query("one_snapshot"), *NO_JIT)


async def execute(cur: Cursor, step: Query, skip: frozenset[str] = frozenset()) -> Any:
    sql = None if step.name in skip else Q.get(step.name)
    if sql is None:
        if step.optional:
            return 0 if step.count else []
        raise KeyError(f"PostgreSQL has no query named {step.name!r}")
    # never prepared: a generic plan would not know how many items an array holds (the
    # pool's connections prepare nothing anyway, ``connect.SESSIONLESS``; a caller's own,
    # in ``run_in``, might)
    await cur.execute(sql, bind(step.args), prepare=False)
    if step.count:
        return cur.rowcount
    return await cur.fetchall() if cur.description is not None else []


async def together(cur: Cursor, steps: Group, skip: frozenset[str] = frozenset()) -> list[Any]:
    """Run statements in one pipeline: sent at once, one round trip for them all (a
    result per statement, in order). ``skip``: optional statements not to run. In a
    transaction, or in autocommit on a direct connection only (``run_alone``): the
    pipeline's end in autocommit can leave a pooler's server connection held for ever."""
    if len(steps) <= 1:
        return [await execute(cur, q, skip) for q in steps]
    conn = cur.connection
    cursors: list[Cursor | None] = []
    # One Sync, the one the pipeline's end sends (then it fetches every result): an
    # explicit sync() before the end made two, and two waits for the server's answer.
    async with conn.pipeline():
        for q in steps:
            if q.name not in Q or q.name in skip:
                if not q.optional:
                    raise KeyError(f"PostgreSQL has no query named {q.name!r}")
                cursors.append(None)
                continue
            c = conn.cursor(row_factory=cur.row_factory)
            await c.execute(Q[q.name], bind(q.args), prepare=False)
            cursors.append(c)
    out: list[Any] = []
    for q, done in zip(steps, cursors, strict=True):
        if done is None:
            out.append(0 if q.count else [])
        elif q.count:
            out.append(done.rowcount)
        else:
            out.append(await done.fetchall() if done.description is not None else [])
    return out


_NOW = Query("store_now", {"now": None})
#: what the error of a fenced finish that aborted itself names (``run_alone``)
RACED = "kirim_fence_raced"


async def drive(
    op: Operation[T],
    cur: Cursor,
    time: StoreTime,
    skip: frozenset[str] = frozenset(),
    lead: tuple[Query, ...] = (),
) -> T:
    """Answer each step of ``op`` until it returns. The time of record is read once per
    transaction: on the database's clock, the first group of statements also reads it
    (after them: after their locks), so that a later ``TIME`` costs no round trip of
    its own; a statement's ``Now`` is None there (``kirim_now(NULL)`` reads it).
    ``lead``: statements sent in one pipeline with the first one (``NO_JIT``: the
    settings of a transaction the driver runs, not of a caller's). ``skip``: optional
    statements not to run (``SETS_LOCAL`` in a caller's transaction)."""
    answer: Any = None
    read: float | None = None
    try:
        while True:
            step = op.send(answer)
            if isinstance(step, Query):
                if lead:
                    *_, answer = await together(cur, (*lead, step), skip)
                else:
                    answer = await execute(cur, step, skip)
                lead = ()
            elif isinstance(step, tuple):
                if time == "database" and read is None:
                    *answer, found = await together(cur, (*lead, *step, _NOW), skip)
                    read = float(found[0]["now"])
                else:
                    answer = await together(cur, (*lead, *step), skip)
                answer = answer[len(lead) :]
                lead = ()
            elif isinstance(step, Now):
                answer = None if time == "database" else _at(time)(step.given)
            elif time == "database":
                if read is None:
                    *_, [found] = await together(cur, (*lead, _NOW), skip)
                    read = float(found["now"])
                    lead = ()
                answer = fixed_time(read)
            else:
                answer = _at(time)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _at(time: StoreTime) -> At:
    """``at`` of the callers' own times, or of the given clock read now."""
    if time is None:
        return callers_time
    assert not isinstance(time, str)
    return fixed_time(float(time.now()))


class PostgresDriver:
    """Runs operations on a PostgreSQL database (``postgresql://user@host/db``)."""

    dialect = "postgres"
    listens = True
    enqueues_in = True
    finishes_fenced = True

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        time: StoreTime = None,
        listen_url: str | None = None,
    ) -> None:
        from kirim.store.postgres.connect import postgres_conninfo
        from kirim.store.postgres.ledger import LedgerWatch
        from kirim.store.postgres.listen import Listener

        self.url = url
        self.time = time
        self.conninfo, sizes = postgres_conninfo(url)
        self.min_size, self.max_size = sizes["pool_min_size"], sizes["pool_max_size"]
        self.timeout = timeout
        self.listen_url = listen_url
        self._listen_conninfo = self.conninfo
        if listen_url is not None:
            self._listen_conninfo = postgres_conninfo(listen_url)[0]
        #: where LISTEN goes, and the routes the connections took (found by ``open``)
        self.wakeups = Wakeups(via="database" if listen_url is None else "listen_url")
        self._pool: AsyncConnectionPool[Any] | None = None
        self._listener = Listener(self._listen_conninfo, connect_timeout=timeout)
        #: the intents committed lately, checked after a lost connection (``ledger``)
        self.ledger = LedgerWatch()
        #: the pool's connections whose sessions run a statement alone at another level
        #: than READ COMMITTED (``_configure``): ``run_alone`` takes a transaction there
        self._other_level: weakref.WeakSet[psycopg.AsyncConnection[Any]] = weakref.WeakSet()

    @property
    def listen_conninfo(self) -> str:
        """Where a LISTEN goes (``listen_url``, else ``url``)."""
        return self._listen_conninfo

    async def open(self) -> None:
        """Connect (one attempt first, so that a missing server or database is one
        ``ConfigError`` within the URL's ``connect_timeout``, else ``timeout``), then
        open the pool."""
        from kirim.store.postgres.connect import SESSIONLESS, probe
        from kirim.text import redact_url, scrub

        if self._pool is not None:
            return
        found = await probe(self.conninfo, self.url, wait=self.timeout, listen=False)
        listen = found
        if self.listen_url is not None:
            # Only the workers LISTEN: a listen_url that does not answer (from an app
            # host, say) fails no command; a worker polls until it does.
            try:
                listen = await probe(
                    self._listen_conninfo, self.listen_url, wait=self.timeout, listen=True
                )
            except ConfigError:
                listen = None
        self.wakeups = Wakeups(via=self.wakeups.via, database=found, listen=listen)
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            self.conninfo,
            min_size=self.min_size,
            max_size=self.max_size,
            timeout=self.timeout,
            open=False,
            connection_class=psycopg.AsyncConnection[DictRow],
            kwargs=SESSIONLESS | {"autocommit": True, "row_factory": dict_row},
            configure=self._configure,
            name="kirim",
        )
        try:
            await pool.open(wait=True, timeout=self.timeout)
        except psycopg.Error as exc:
            await pool.close()
            why = scrub(str(exc), self.url)
            raise StoreError(
                f"PostgreSQL: cannot connect to {redact_url(self.url)}: {why}"
            ) from exc
        self._pool = pool

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Each pool connection as ``connect.configure`` makes it; on a direct connection,
        whether its statements run alone in autocommit would run at READ COMMITTED
        (else ``run_alone`` runs them in a transaction, which says its level). Through a
        pooler ``run_alone`` always takes a transaction: nothing to ask."""
        from kirim.store.postgres.connect import configure, session_reads_committed

        await configure(conn)
        if self.direct and not await session_reads_committed(conn):
            self._other_level.add(conn)

    async def close(self) -> None:
        await self._listener.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def _failed(self, exc: psycopg.Error) -> StoreError:
        """A StoreError for ``exc``; after a lost connection, purge the dead ones."""
        if isinstance(exc, psycopg.OperationalError) and self._pool is not None:
            self.ledger.connection_lost()
            with contextlib.suppress(Exception):
                await self._pool.check()
        return StoreError(f"PostgreSQL: {exc}".strip())

    @contextlib.asynccontextmanager
    async def cursor(self, *, transaction: bool | None) -> AsyncIterator[Cursor]:
        """A cursor on a pool connection, in one transaction or in autocommit (None:
        autocommit where the connection's session runs a statement at READ COMMITTED,
        else a transaction: ``run_alone``)."""
        if self._pool is None:
            raise StoreError("store is not open")
        try:
            async with self._pool.connection() as conn:
                if self.ledger.pending:  # back after a lost connection: is the ledger whole?
                    async with conn.cursor() as cur:
                        await self.ledger.check(cur)
                if transaction is None:
                    transaction = conn in self._other_level
                if transaction:
                    async with conn.transaction(), conn.cursor() as cur:
                        yield cur
                else:
                    async with conn.cursor() as cur:
                        yield cur
        except psycopg.Error as exc:
            raise await self._failed(exc) from exc

    @property
    def direct(self) -> bool:
        """Whether the store's connections reach the server itself (the route found when
        it opened): False through a pooler, or where it cannot be told."""
        found = self.wakeups.database
        return found is not None and found.in_front is False

    async def run(self, op: Operation[T], *, write: bool = True, snapshot: bool = True) -> T:
        """Run ``op`` in one transaction, its settings (``NO_JIT``) sent with its first
        statement; a read of several statements in one snapshot (``ONE_SNAPSHOT``:
        REPEATABLE READ, read only), or, a read of one statement (``snapshot`` False),
        in autocommit: one round trip, with the session's settings."""
        transaction = write or snapshot
        lead = NO_JIT if write else ONE_SNAPSHOT if snapshot else ()
        async with self.cursor(transaction=transaction) as cur:
            return await drive(op, cur, self.time, lead=lead)

    async def run_alone(self, op: Operation[T]) -> T:
        """Run ``op``, one statement atomic on its own (a batch's intents, its plain
        finish), with the JIT off (``NO_JIT``). On a direct connection in autocommit: one
        round trip, a pipeline whose implicit transaction the two statements share.
        Through a pooler (or where the route cannot be told) in a transaction of its
        own, BEGIN and COMMIT apart: psycopg ends a pipeline with a Sync and then a
        Flush, and a pooler in transaction mode that had handed the server connection
        back at the Sync's answer gave one to the Flush, which has none: that server
        connection stayed this client's, and a client waiting for it waited for ever
        (PgBouncer 1.18, tests/contract/test_postgres_pooler.py); and on a direct
        connection whose session runs statements at another level than READ COMMITTED
        (``connect.ISOLATION``), in a transaction, which says its level. A statement that
        aborted itself because a fence it had passed on one row failed on the next
        (``finish_fenced``: an error naming ``kirim_fence_raced``) raises ``FenceRaced``:
        it wrote nothing."""
        from kirim.store.transitions import FenceRaced

        async with self.cursor(transaction=None if self.direct else True) as cur:
            try:
                return await drive(op, cur, self.time, lead=NO_JIT)
            except psycopg.errors.InvalidTextRepresentation as exc:
                if RACED not in str(exc):
                    raise
                raise FenceRaced(str(exc)) from exc

    def committed(self, intents: Sequence[Intent], done: Sequence[bool]) -> None:
        self.ledger.committed(intents, done)

    async def run_in(self, conn: psycopg.AsyncConnection[Any], op: Operation[T]) -> T:
        """Run ``op`` on the caller's connection, in the transaction it has open, with
        the caller's settings (nothing of ``SETS_LOCAL``: the caller's later statements
        would plan by them)."""
        try:
            async with conn.cursor(row_factory=dict_row) as cur:
                return await drive(op, cur, self.time, SETS_LOCAL)
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL: {exc}") from exc

    async def wait_for_jobs(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait on the dedicated LISTEN connection (``listen.Listener``)."""
        if self._pool is None:
            raise StoreError("store is not open")
        return await self._listener.wait(timeout)

    async def migrate(self) -> int:
        async with self.cursor(transaction=True) as cur:
            await rows(cur, "migrate_lock")
            await rows(cur, "create_meta")
            current = await _version(cur)
            if current > SCHEMA_VERSION:
                raise SchemaError(too_new(current))
            for version, sql in migrations("postgres"):
                if version > current:
                    await cur.execute(sql)
                    await rows(cur, "set_schema_version", {"version": str(version)})
                    current = version
            return current

    async def schema_version(self) -> int:
        async with self.cursor(transaction=False) as cur:
            found = await rows(cur, "meta_exists")
            return await _version(cur) if found and found[0]["present"] else 0

    async def check_schema(self) -> None:
        from kirim.text import redact_url

        check_version(redact_url(self.url), await self.schema_version())


async def _version(cur: Cursor) -> int:
    found = await rows(cur, "schema_version")
    return parse_version(found[0]["value"]) if found else 0
