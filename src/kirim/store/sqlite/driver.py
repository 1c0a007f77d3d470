"""The SQLite driver: one file, WAL, ``BEGIN IMMEDIATE`` for every write.

The driver owns one connection used from one dedicated thread, so a whole operation
(``kirim.store.sequence``: a batch of claims, intents or outcomes) costs one hop off
the event loop. Several worker processes on one file are safe: writers serialise on
the database lock and wait up to ``busy_timeout``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import operator
import re
import sqlite3
import time as _time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from kirim.errors import ConfigError, SchemaError, StoreError
from kirim.store.base import SCHEMA_VERSION, Intent, StoreTime
from kirim.store.schema import check_version, parse_version, too_new
from kirim.store.sequence import At, Now, Operation, Query, callers_time, fixed_time
from kirim.store.sqlfiles import load_queries, migrations
from kirim.store.sqlite.changed import write_changed
from kirim.text import redact_url

T = TypeVar("T")
Q = load_queries("sqlite")
_SYNC = {"off", "normal", "full", "extra"}


def sqlite_path(url: str) -> tuple[str, dict[str, str]]:
    """``sqlite:///rel.db`` → ``rel.db``; ``sqlite:////abs.db`` → ``/abs.db``."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or not parts.path or parts.path == "/":
        raise ConfigError(
            f"not a SQLite URL: {redact_url(url)!r} (expected sqlite:///path/to/file.db)"
        )
    params = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return parts.path[1:], params


def connect_read_only(path: str, *, timeout: float) -> sqlite3.Connection:
    """A connection that only reads an existing database file: it never creates the file
    nor writes it (``mode=ro``, ``query_only``), for the commands that only look.

    A WAL database whose ``-shm`` file can be neither found nor created (a read-only
    directory) is opened ``immutable``: no writer can be at work on it then, since a
    writer needs that file too. ConfigError if there is no such file.
    """
    if not Path(path).is_file():
        raise ConfigError(
            f"no SQLite database at {path!r}: the file does not exist "
            "(check --database, or run `kirim init` to create it)"
        )
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=timeout, check_same_thread=False)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as exc:
        conn.close()
        if getattr(exc, "sqlite_errorname", "") != "SQLITE_CANTOPEN":
            raise
        conn = sqlite3.connect(
            uri + "&immutable=1", uri=True, timeout=timeout, check_same_thread=False
        )
    conn.execute("PRAGMA query_only = ON")
    return conn


def bind(args: Mapping[str, Any]) -> dict[str, Any]:
    """A set (a list of ids or records) is one JSON parameter (``json_each``)."""
    return {k: json.dumps(v) if isinstance(v, list | tuple) else v for k, v in args.items()}


#: a string literal, a comment, or a named parameter (group 1): only the last is numbered
_PARAMETER = re.compile(r"'(?:[^']|'')*'|--[^\n]*|(?<![:\w]):([A-Za-z_]\w*)")


@functools.cache
def positional(sql: str) -> tuple[str, Callable[[Mapping[str, Any]], tuple[Any, ...]]]:
    """``sql`` with its named parameters numbered (``:id`` → ``?1``, the same number
    each time a name recurs), and what picks a record's values in that order: sqlite3
    binds a tuple of a statement run per record (executemany) about 1.5 µs a row
    cheaper than a mapping it must look each name up in."""
    names: dict[str, int] = {}

    def number(found: re.Match[str]) -> str:
        name = found.group(1)
        if name is None:
            return found.group(0)
        return f"?{names.setdefault(name, len(names) + 1)}"

    numbered = _PARAMETER.sub(number, sql)
    order = list(names)
    if not order:
        return numbered, lambda record: ()
    if len(order) == 1:
        only = order[0]
        return numbered, lambda record: (record[only],)
    return numbered, operator.itemgetter(*order)


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
        if not step.count:
            raise ValueError(f"{step.name}: a statement run per record returns no rows")
        if step.read is not None:  # written over rows read: set only what changed
            return write_changed(conn, sql, rows, step.read, positional)
        numbered, pick = positional(sql)
        try:
            values = [pick(row) for row in rows]
        except KeyError:  # a record without a parameter: sqlite3 says which
            cursor = conn.executemany(sql, rows)
        else:
            cursor = conn.executemany(numbered, values)
        return cursor.rowcount
    cursor = conn.cursor()
    cursor.row_factory = None  # plain tuples, made into dicts by ``rows_of``
    cursor.execute(sql, bind(step.args))
    return cursor.rowcount if step.count else rows_of(cursor)


def rows_of(cursor: sqlite3.Cursor) -> list[dict[str, Any]]:
    """The rows a statement read, each a dict by column name, as PostgreSQL's driver
    gives them (``dict_row``). A transition reads a row's columns by name a dozen times
    or more: a dict looks each up in one probe, where ``sqlite3.Row`` compares the
    name with every column before it, ignoring case (a claim's joined row has 33).
    A name that recurs keeps its first column's value, as ``sqlite3.Row`` does."""
    if cursor.description is None:  # a statement that reads no columns
        return []
    names = [d[0] for d in cursor.description]
    found = cursor.fetchall()
    if len(set(names)) == len(names):
        return [dict(zip(names, row, strict=True)) for row in found]
    first = [i for i, name in enumerate(names) if names.index(name) == i]
    kept = [names[i] for i in first]
    return [dict(zip(kept, (row[i] for i in first), strict=True)) for row in found]


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
            elif isinstance(step, Now):
                answer = at(step.given)
            else:
                answer = at
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


class SQLiteDriver:
    """Runs operations on one SQLite file (``sqlite:///kirim.db``)."""

    dialect = "sqlite"
    #: no LISTEN/NOTIFY (a worker polls), no enqueue in a caller's transaction, and no
    #: statement run on its own: the fenced finish's statements and the careful way
    #: share the finish's one transaction, which holds the database's write lock
    listens = False
    enqueues_in = False
    finishes_fenced = False

    def __init__(
        self,
        url: str,
        *,
        busy_timeout: float = 30.0,
        time: StoreTime = None,
        read_only: bool = False,
    ) -> None:
        self.url = url
        self.time = time
        self.read_only = read_only
        self.path, params = sqlite_path(url)
        self.synchronous = params.get("synchronous", "full").lower()
        if self.synchronous not in _SYNC:
            raise ConfigError(
                f"synchronous must be one of {sorted(_SYNC)}, not {self.synchronous!r}"
            )
        self.busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        #: called with each connection this driver opens, once it is set up (the
        #: explorer's audits give it a function: ``kirim.explore.finishes``)
        self.on_connect: Callable[[sqlite3.Connection], object] | None = None

    def _at(self) -> At:
        """The time of record of one transaction: the callers' own times, or one clock
        read once (inside the transaction, after its lock)."""
        if self.time is None:
            return callers_time
        if self.time == "database":
            return fixed_time(_time.time())  # every process on the file shares this clock
        return fixed_time(self.time.now())

    async def open(self) -> None:
        if self._conn is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kirim-sqlite")
        try:
            self._conn = await self._call(self._connect)
        except sqlite3.Error as exc:
            await self.close()
            raise ConfigError(f"cannot open SQLite database {self.path!r}: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        if self.read_only and self.path != ":memory:":
            conn = connect_read_only(self.path, timeout=self.busy_timeout)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            return conn
        if self.path != ":memory:":
            parent = Path(self.path).parent
            if not parent.exists():
                raise ConfigError(f"directory {str(parent)!r} of the database does not exist")
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=self.busy_timeout
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        if self.on_connect is not None:
            self.on_connect(conn)
        return conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._call(conn.close)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def committed(self, intents: Sequence[Intent], done: Sequence[bool]) -> None:
        """Nothing to watch: SQLite loses no acknowledged commit (``synchronous=full``)."""

    def abandon(self) -> None:
        """Drop the connection without a word, as a process that died does (the
        explorer's dead hosts)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)

    async def _call(self, fn: Callable[[], T]) -> T:
        if self._executor is None:
            raise StoreError("store is not open")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn)

    async def _tx(self, fn: Callable[[sqlite3.Connection], T], *, write: bool = True) -> T:
        """Run ``fn`` in one transaction on the driver's thread."""

        def run() -> T:
            conn = self._conn
            if conn is None:
                raise StoreError("store is not open")
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        try:
            return await self._call(run)
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite: {exc}") from exc

    async def run(self, op: Operation[T], *, write: bool = True, snapshot: bool = True) -> T:
        """Run ``op`` in one transaction: a write takes the database's write lock at
        once (``BEGIN IMMEDIATE``); a read does not. (A read is always one snapshot.)"""
        return await self._tx(lambda conn: drive(op, conn, self._at()), write=write)

    async def migrate(self) -> int:
        def run(conn: sqlite3.Connection) -> int:
            conn.execute(Q["create_meta"])
            current = _version(conn)
            if current > SCHEMA_VERSION:
                raise SchemaError(too_new(current))
            for version, sql in migrations("sqlite"):
                if version > current:
                    for statement in _statements(sql):
                        conn.execute(statement)
                    if "writable_schema" in sql:
                        _reload_schema(conn)
                    conn.execute(Q["set_schema_version"], {"version": str(version)})
                    current = version
            return current

        return await self._tx(run)

    async def schema_version(self) -> int:
        def run(conn: sqlite3.Connection) -> int:
            exists = conn.execute(Q["meta_exists"]).fetchone()
            return _version(conn) if exists else 0

        return await self._tx(run, write=False)

    async def check_schema(self) -> None:
        check_version(self.url, await self.schema_version())


def _version(conn: sqlite3.Connection) -> int:
    row = conn.execute(Q["schema_version"]).fetchone()
    return parse_version(row["value"]) if row else 0


def _reload_schema(conn: sqlite3.Connection) -> None:
    """After a migration that edited the schema's text (``PRAGMA writable_schema``):
    bump SQLite's schema cookie, so that this connection and every other one read it
    again (the step SQLite's ALTER TABLE documentation gives)."""
    cookie = int(conn.execute("PRAGMA schema_version").fetchone()[0])
    conn.execute(f"PRAGMA schema_version = {cookie + 1}")
    check = conn.execute("PRAGMA quick_check").fetchone()[0]
    if check != "ok":
        raise SchemaError(f"the schema is damaged after a migration: {check}")


def _statements(sql: str) -> list[str]:
    """The statements of a migration, in order: split at each ``;`` that ends one (a
    trigger's ``BEGIN … END;`` stays whole)."""
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    out: list[str] = []
    pending = ""
    for part in "\n".join(lines).split(";"):
        pending += part + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                out.append(pending.strip().removesuffix(";").strip())
            pending = ""
    if pending.strip(" \n;"):
        out.append(pending.strip().removesuffix(";").strip())
    return out
