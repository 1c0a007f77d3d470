"""``kirim doctor``'s view of a database: read-only queries and catalog lookups.

Works on any SQLite file or PostgreSQL database, kirim's or someone else's: finds
a table's columns and unique indexes (``sqlite_master`` and PRAGMAs; ``pg_index``,
the catalog behind ``pg_indexes``), and the duplicates a missing index let in.
Queries are written with ``?`` placeholders and never contain ``%`` or ``?``
otherwise, so that they run unchanged on both.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kirim.errors import ConfigError, NotFound, StoreError
from kirim.store.pooler import Route, route
from kirim.text import redact_url, scrub

#: the two kinds of database ``kirim doctor`` reads (each has its ``doctor.sql``)
Dialect = Literal["sqlite", "postgres"]


@dataclass(frozen=True, slots=True)
class UniqueIndex:
    name: str
    columns: tuple[str, ...]  # key columns, in index order ("" for an expression)
    partial: bool = False  # WHERE …: guarantees nothing outside the predicate
    valid: bool = True  # PostgreSQL: a failed CREATE INDEX CONCURRENTLY leaves it invalid
    primary: bool = False


@dataclass(frozen=True, slots=True)
class Table:
    display: str  # the name to print and to put in SQL (quoted where needed)
    columns: dict[str, bool]  # name -> NOT NULL
    key: int | str  # PostgreSQL: the oid; SQLite: the exact name


class Database:
    """One read-only connection to SQLite (``sqlite:///…``) or PostgreSQL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect: Dialect = "sqlite" if url.startswith("sqlite:") else "postgres"
        self._conn: Any = _open_sqlite(url) if self.dialect == "sqlite" else _open_postgres(url)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def query(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Rows as dicts (``?`` placeholders on both backends)."""
        names, rows = self._run(sql, args)
        return [dict(zip(names, row, strict=True)) for row in rows]

    def tuples(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._run(sql, args)[1]

    def scalar(self, sql: str, args: Sequence[Any] = ()) -> Any:
        rows = self.tuples(sql, args)
        return rows[0][0] if rows else None

    def named(self, name: str, args: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rows of the dialect's named query ``name`` (``store/<dialect>/sql/doctor.sql``)."""
        names, rows = self._execute(_queries(self.dialect)[name], args or {})
        return [dict(zip(names, row, strict=True)) for row in rows]

    def named_scalar(self, name: str, args: Mapping[str, Any] | None = None) -> Any:
        _, rows = self._execute(_queries(self.dialect)[name], args or {})
        return rows[0][0] if rows else None

    def _run(self, sql: str, args: Sequence[Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
        params: tuple[Any, ...] | None = tuple(args)
        if self.dialect == "postgres":
            # No parameters: psycopg then leaves the text alone (a % in a quoted name).
            sql, params = (sql.replace("?", "%s"), params) if args else (sql, None)
        return self._execute(sql, params)

    def _execute(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        try:
            if self.dialect == "postgres":
                # each query in a READ ONLY transaction of its own (see _open_postgres)
                with self._conn.transaction():
                    cur = self._conn.execute(sql, params)
                    names = [d[0] for d in cur.description or ()]
                    return names, [tuple(r) for r in cur.fetchall()]
            cur = self._conn.execute(sql, params)
            names = [d[0] for d in cur.description or ()]
            return names, [tuple(r) for r in cur.fetchall()]
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite: {exc}") from exc
        except Exception as exc:
            if type(exc).__module__.startswith("psycopg"):
                raise StoreError(f"PostgreSQL: {str(exc).strip()}") from exc
            raise

    def route(self) -> Route | None:
        """PostgreSQL: how this connection reaches the server (a pooler in front?);
        None on SQLite, or when the server would not say."""
        if self.dialect != "postgres":
            return None
        try:
            seen = self.named_scalar("doctor_client_port")
        except StoreError:
            return None
        return route(self._conn.pgconn.socket, seen)

    def quote(self, name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    # -- catalogs -----------------------------------------------------------------------

    def table(self, name: str) -> Table:
        """The table ``name`` (``schema.table`` on PostgreSQL), or NotFound."""
        if self.dialect == "sqlite":
            found = self.scalar(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE",
                (name,),
            )
            if found is None:
                raise NotFound(f"no table {name!r} in {redact_url(self.url)}")
            info = self.query(f"PRAGMA table_info({self.quote(found)})")
            columns = {r["name"]: bool(r["notnull"] or r["pk"]) for r in info}
            return Table(display=_bare(found, self.quote), columns=columns, key=found)
        rows = self.query(
            "SELECT c.oid::bigint AS oid, c.oid::regclass::text AS display FROM pg_class c "
            "WHERE c.oid = to_regclass(?) AND c.relkind IN ('r', 'p')",
            (name,),
        )
        if not rows:
            raise NotFound(
                f"no table {name!r} in {redact_url(self.url)} (schema.table, or on the search_path)"
            )
        oid = int(rows[0]["oid"])
        cols = self.query(
            "SELECT attname, attnotnull FROM pg_attribute "
            "WHERE attrelid = ? AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (oid,),
        )
        return Table(
            display=rows[0]["display"],
            columns={r["attname"]: bool(r["attnotnull"]) for r in cols},
            key=oid,
        )

    def unique_indexes(self, table: Table) -> list[UniqueIndex]:
        """Unique indexes and constraints (and the primary key) of ``table``."""
        if self.dialect == "sqlite":
            return self._sqlite_unique(table)
        rows = self.query(
            "SELECT i.relname AS name, x.indisprimary AS is_primary, x.indisvalid AS valid, "
            "x.indpred IS NOT NULL AS partial, "
            "ARRAY(SELECT COALESCE(a.attname, '') "
            "      FROM unnest(x.indkey::int2[]) WITH ORDINALITY AS k (attnum, ord) "
            "      LEFT JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum "
            "      WHERE k.ord <= x.indnkeyatts ORDER BY k.ord) AS columns "
            "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "WHERE x.indrelid = ? AND x.indisunique ORDER BY i.relname",
            (table.key,),
        )
        return [
            UniqueIndex(
                name=r["name"],
                columns=tuple(r["columns"]),
                partial=bool(r["partial"]),
                valid=bool(r["valid"]),
                primary=bool(r["is_primary"]),
            )
            for r in rows
        ]

    def _sqlite_unique(self, table: Table) -> list[UniqueIndex]:
        name = str(table.key)
        found = []
        info = self.query(f"PRAGMA table_info({self.quote(name)})")
        pk = tuple(r["name"] for r in sorted(info, key=lambda r: r["pk"]) if r["pk"])
        if pk:  # an INTEGER PRIMARY KEY is the rowid: it has no index of its own
            found.append(UniqueIndex(name="PRIMARY KEY", columns=pk, primary=True))
        for index in self.query(f"PRAGMA index_list({self.quote(name)})"):
            if not index["unique"] or index["origin"] == "pk":
                continue
            cols = self.query(f"PRAGMA index_info({self.quote(index['name'])})")
            found.append(
                UniqueIndex(
                    name=index["name"],
                    columns=tuple(c["name"] or "" for c in sorted(cols, key=lambda c: c["seqno"])),
                    partial=bool(index["partial"]),
                )
            )
        return found

    def duplicates(
        self, table: Table, columns: Sequence[str], *, limit: int = 10
    ) -> tuple[int, list[tuple[Any, ...]]]:
        """(number of duplicated keys, up to ``limit`` of them as (values…, count))."""
        cols = ", ".join(self.quote(c) for c in columns)
        rows = self.tuples(
            f"SELECT {cols}, count(*) AS kirim_n, count(*) OVER () AS kirim_groups "
            f"FROM {table.display} GROUP BY {cols} HAVING count(*) > 1 "
            f"ORDER BY kirim_n DESC LIMIT {int(limit)}"
        )
        total = int(rows[0][-1]) if rows else 0
        return total, [row[:-1] for row in rows]


def _bare(name: str, quote: Any) -> str:
    """A name as SQL: bare when it is a plain lower-case identifier, else quoted."""
    plain = name.replace("_", "").isalnum() and name.isascii() and not name[0].isdigit()
    return name if plain and name == name.lower() else str(quote(name))


def _open_sqlite(url: str) -> sqlite3.Connection:
    from kirim.store.sqlite import connect_read_only, sqlite_path

    path, _ = sqlite_path(url)
    if path != ":memory:" and not Path(path).is_file():
        raise ConfigError(f"no SQLite database at {path!r}; check --database or --dsn")
    try:
        # mode=ro: never creates nor writes a file; a read-only file or directory is fine
        if path == ":memory:":
            return sqlite3.connect(":memory:")
        return connect_read_only(path, timeout=10)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the SQLite database {path!r}: {exc}") from exc


def _open_postgres(url: str) -> Any:
    if not url.startswith(("postgresql:", "postgres:")):
        raise ConfigError(
            f"unsupported database URL {redact_url(url)!r}; use sqlite:///path.db or "
            "postgresql://host/db"
        )
    try:
        import psycopg

        from kirim.store.postgres import postgres_conninfo, redact
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(
            "PostgreSQL needs the postgres extra: pip install 'kirim[postgres]'"
        ) from exc
    conninfo, _ = postgres_conninfo(url)
    try:
        # Read-only per transaction, not by a SET in the session: behind a pooler in
        # transaction mode a SET lands on a server connection that other clients use
        # next (a worker's writes would then be refused), and is gone for our next query.
        conn = psycopg.connect(
            conninfo, autocommit=True, connect_timeout=10, prepare_threshold=None
        )
        conn.read_only = True
    except psycopg.Error as exc:
        raise StoreError(
            f"PostgreSQL: cannot connect to {redact(url)}: {scrub(str(exc).strip(), url)}"
        ) from exc
    return conn


@functools.cache
def _queries(dialect: Dialect) -> dict[str, str]:
    from kirim.store.sqlfiles import load_queries

    return load_queries(dialect)
