"""SQLite backend: one file, WAL, ``BEGIN IMMEDIATE`` for every write.

Each store owns one connection used from one dedicated thread, so a whole
transaction (a batch of claims, intents or outcomes) costs one hop off the event
loop. Several worker processes on one file are safe: writers serialise on the
database lock and wait up to ``busy_timeout``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time as _time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs, urlsplit

from kirim.errors import ConfigError, SchemaError, StoreError
from kirim.keys import text_problem
from kirim.model import Attempt, Delivery, DeliveryStatus, EnqueueResult, Job
from kirim.store import logic
from kirim.store.base import (
    SCHEMA_VERSION,
    ApiToken,
    Claim,
    DeadLetter,
    Finish,
    FinishResult,
    Intent,
    Lease,
    NewDelivery,
    QueueStats,
    Reaped,
    RequestBegin,
    RequestedDelivery,
    RequestSlot,
    RequestState,
    Respond,
    StoredResponse,
    StoreTime,
)
from kirim.store.logic import (
    Row,
    attempt_from,
    delivery_from,
    job_from,
    request_slot_from,
    token_from,
)
from kirim.store.schema import check_version, parse_version, too_new
from kirim.store.sqlfiles import load_queries, migrations
from kirim.validation import as_id

T = TypeVar("T")
Q = load_queries("sqlite")
_SYNC = {"off", "normal", "full", "extra"}


def sqlite_path(url: str) -> tuple[str, dict[str, str]]:
    """``sqlite:///rel.db`` → ``rel.db``; ``sqlite:////abs.db`` → ``/abs.db``."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or not parts.path or parts.path == "/":
        raise ConfigError(f"not a SQLite URL: {url!r} (expected sqlite:///path/to/file.db)")
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


class _SQLiteOps:
    """Named queries on one connection, for the shared claim logic."""

    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def one(self, name: str, args: Sequence[Any] | Mapping[str, Any]) -> Row | None:
        row: Row | None = self.conn.execute(Q[name], args).fetchone()
        return row

    def all(self, name: str, args: Sequence[Any] | Mapping[str, Any]) -> list[Row]:
        return list(self.conn.execute(Q[name], args).fetchall())

    def run(self, name: str, args: Sequence[Any] | Mapping[str, Any]) -> int:
        return self.conn.execute(Q[name], args).rowcount


class SQLiteStore:
    """The embedded backend (``sqlite:///kirim.db``)."""

    def __init__(
        self,
        url: str,
        *,
        busy_timeout: float = 30.0,
        time: StoreTime = None,
        read_only: bool = False,
    ) -> None:
        """``time``: the time of record (``StoreTime``); None takes each caller's ``now``.
        ``read_only``: open an existing file for reading only (never create or change it)."""
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

    # -- plumbing -----------------------------------------------------------------

    def _t(self, now: float) -> float:
        """The time of record, read inside the transaction (after its lock)."""
        if self.time is None:
            return now
        if self.time == "database":
            return _time.time()  # every process on the file shares this host's clock
        return self.time.now()

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
        return conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._call(conn.close)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def _call(self, fn: Callable[[], T]) -> T:
        if self._executor is None:
            raise StoreError("store is not open")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn)

    async def _tx(self, fn: Callable[[sqlite3.Connection], T], *, write: bool = True) -> T:
        """Run ``fn`` in one transaction on the store's thread."""

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

    # -- schema -------------------------------------------------------------------

    async def migrate(self) -> int:
        def run(conn: sqlite3.Connection) -> int:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS kirim_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            current = _version(conn)
            if current > SCHEMA_VERSION:
                raise SchemaError(too_new(current))
            for version, sql in migrations("sqlite"):
                if version > current:
                    for statement in _statements(sql):
                        conn.execute(statement)
                    conn.execute(
                        "INSERT INTO kirim_meta (key, value) VALUES ('schema_version', ?) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        (str(version),),
                    )
                    current = version
            return current

        return await self._tx(run)

    async def check_schema(self) -> None:
        def run(conn: sqlite3.Connection) -> int:
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'kirim_meta'"
            ).fetchone()
            return _version(conn) if exists else 0

        version = await self._tx(run, write=False)
        check_version(self.url, version)

    # -- write path ---------------------------------------------------------------

    async def enqueue(self, items: Sequence[NewDelivery], *, now: float) -> list[EnqueueResult]:
        return await self._tx(lambda conn: _enqueue(conn, items, self._t(now)))

    async def claim(self, *, worker_id: str, now: float, lease: float, limit: int) -> list[Claim]:
        return await self._tx(
            lambda conn: logic.claim(_SQLiteOps(conn), worker_id, self._t(now), lease, limit)
        )

    async def heartbeat(self, leases: Sequence[Lease], *, now: float, lease: float) -> list[bool]:
        def run(conn: sqlite3.Connection) -> list[bool]:
            t = self._t(now)
            until = t + lease
            held = []
            for it in leases:
                ok = conn.execute(Q["heartbeat_job"], (until, t, it.job_id, it.token)).rowcount
                conn.execute(Q["heartbeat_delivery"], (until, it.delivery_id, it.token))
                held.append(ok == 1)
            return held

        return await self._tx(run)

    async def record_intents(self, intents: Sequence[Intent]) -> list[bool]:
        def run(conn: sqlite3.Connection) -> list[bool]:
            # In delivery id order, the lock order of every backend; results in input order.
            order = sorted(range(len(intents)), key=lambda i: intents[i].delivery_id)
            written = dict(zip(order, write([intents[i] for i in order], conn), strict=True))
            return [written[i] for i in range(len(intents))]

        def write(items: Sequence[Intent], conn: sqlite3.Connection) -> list[bool]:
            return [
                conn.execute(
                    Q["insert_attempt_fenced"],
                    {
                        "delivery_id": it.delivery_id,
                        "job_id": it.job_id,
                        "number": it.number,
                        "request_id": it.provider_request_id,
                        "worker_id": it.worker_id,
                        "now": self._t(it.requested_at),
                        "send_deadline": it.send_deadline,
                        "settles_at": it.settles_at,
                        "token": it.token,
                    },
                ).rowcount
                == 1
                for it in items
            ]

        return await self._tx(run)

    async def finish(self, items: Sequence[Finish]) -> list[FinishResult]:
        return await self._tx(
            lambda conn: [logic.finish(_SQLiteOps(conn), it, self._t(it.now)) for it in items]
        )

    async def reap(self, *, now: float) -> list[Reaped]:
        return await self._tx(lambda conn: logic.reap(_SQLiteOps(conn), self._t(now)))

    async def release(self, leases: Sequence[Lease], *, now: float) -> None:
        def run(conn: sqlite3.Connection) -> None:
            t = self._t(now)
            for it in leases:
                conn.execute(Q["release_job"], (t, t, it.job_id, it.token))
                conn.execute(Q["release_delivery"], (t, it.delivery_id, it.token))

        await self._tx(run)

    async def next_run_at(self) -> float | None:
        row = await self._tx(lambda c: c.execute(Q["next_run_at"]).fetchone(), write=False)
        return None if row is None or row[0] is None else float(row[0])

    async def next_due_in(self, *, now: float) -> float | None:
        def run(conn: sqlite3.Connection) -> float | None:
            row = conn.execute(Q["next_run_at"]).fetchone()
            return None if row is None or row[0] is None else float(row[0]) - self._t(now)

        return await self._tx(run, write=False)

    async def in_flight(self) -> int:
        row = await self._tx(lambda c: c.execute(Q["count_running"]).fetchone(), write=False)
        return int(row[0])

    # -- read path and operator actions -------------------------------------------

    async def get_delivery(
        self, key_or_id: str, *, by: Literal["auto", "id", "key"] = "auto"
    ) -> Delivery | None:
        if by not in ("auto", "id", "key"):
            raise ValueError(f"by must be 'auto', 'id' or 'key', not {by!r}")
        # no key holds a lone surrogate (sqlite3 cannot even send one); a NUL can be
        # found: notify refuses it now, but databases written before may hold one
        as_key = by != "id" and text_problem(key_or_id.replace("\x00", "")) is None
        number = as_id(key_or_id) if by != "key" else None

        def run(conn: sqlite3.Connection) -> Delivery | None:
            row = None
            if as_key:
                row = conn.execute(
                    "SELECT * FROM kirim_deliveries WHERE idempotency_key = ?", (key_or_id,)
                ).fetchone()
            if row is None and number is not None:
                row = conn.execute(
                    "SELECT * FROM kirim_deliveries WHERE id = ?", (number,)
                ).fetchone()
            return None if row is None else delivery_from(row)

        return await self._tx(run, write=False)

    async def get_job(self, delivery_id: int) -> Job | None:
        return await self._tx(lambda c: _latest_job(c, delivery_id), write=False)

    async def get_attempts(self, delivery_id: int) -> list[Attempt]:
        rows = await self._tx(
            lambda c: c.execute(
                "SELECT * FROM kirim_attempts WHERE delivery_id = ? ORDER BY id", (delivery_id,)
            ).fetchall(),
            write=False,
        )
        return [attempt_from(r) for r in rows]

    async def list_deliveries(
        self,
        *,
        status: DeliveryStatus | None = None,
        channel: str | None = None,
        after_id: int = 0,
        limit: int = 100,
        before_id: int | None = None,
    ) -> list[Delivery]:
        # before_id: the page below it, newest first (kirim list); else oldest first
        newest = before_id is not None
        sql = f"SELECT * FROM kirim_deliveries WHERE id {'<' if newest else '>'} ?"
        args: list[Any] = [before_id if newest else after_id]
        if status is not None:
            sql += " AND status = ?"
            args.append(str(status))
        if channel is not None:
            sql += " AND channel = ?"
            args.append(channel)
        sql += " ORDER BY id DESC LIMIT ?" if newest else " ORDER BY id LIMIT ?"
        args.append(limit)
        rows = await self._tx(lambda c: c.execute(sql, args).fetchall(), write=False)
        return [delivery_from(r) for r in rows]

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        def run(conn: sqlite3.Connection) -> list[DeadLetter]:
            rows = conn.execute(
                "SELECT * FROM kirim_jobs WHERE status = 'dead' ORDER BY id LIMIT ?", (limit,)
            ).fetchall()
            out = []
            for job in rows:
                d = conn.execute(
                    "SELECT * FROM kirim_deliveries WHERE id = ?", (job["delivery_id"],)
                ).fetchone()
                out.append(DeadLetter(delivery=delivery_from(d), job=job_from(job)))
            return out

        return await self._tx(run, write=False)

    async def retry_dead(self, delivery_id: int, *, now: float) -> bool:
        return await self._tx(lambda c: logic.retry_dead(_SQLiteOps(c), delivery_id, self._t(now)))

    async def cancel(self, delivery_id: int, *, now: float) -> bool:
        return await self._tx(lambda c: logic.cancel(_SQLiteOps(c), delivery_id, self._t(now)))

    async def counts(self) -> dict[str, dict[str, int]]:
        def run(conn: sqlite3.Connection) -> dict[str, dict[str, int]]:
            d = conn.execute(
                "SELECT status, COUNT(*) FROM kirim_deliveries GROUP BY status"
            ).fetchall()
            j = conn.execute("SELECT status, COUNT(*) FROM kirim_jobs GROUP BY status").fetchall()
            return {"deliveries": {r[0]: r[1] for r in d}, "jobs": {r[0]: r[1] for r in j}}

        return await self._tx(run, write=False)

    async def queue_stats(self, *, now: float) -> QueueStats:
        def run(conn: sqlite3.Connection) -> QueueStats:
            rows = conn.execute(Q["deliveries_by_status_doubt"]).fetchall()
            t = self._t(now)
            due = conn.execute(Q["due_jobs_summary"], (t,)).fetchone()
            return logic.queue_stats(rows, due["n"], due["oldest"], t)

        return await self._tx(run, write=False)

    async def search_deliveries(self, text: str, *, limit: int = 50) -> list[Delivery]:
        number = as_id(text) or -1
        rows = await self._tx(
            lambda c: c.execute(Q["search_deliveries"], (number, text, text, limit)).fetchall(),
            write=False,
        )
        return [delivery_from(r) for r in rows]

    # -- the HTTP service: API tokens and idempotent requests ---------------------

    async def create_token(
        self, name: str, token_hash: str, *, prefix: str, now: float
    ) -> ApiToken | None:
        row = await self._tx(
            lambda c: c.execute(Q["insert_token"], (name, token_hash, prefix, now)).fetchone()
        )
        return None if row is None else token_from(row)

    async def verify_token(self, token_hash: str) -> ApiToken | None:
        row = await self._tx(
            lambda c: c.execute(Q["token_by_hash"], (token_hash,)).fetchone(), write=False
        )
        return None if row is None else token_from(row)

    async def revoke_token(self, name_or_id: str, *, now: float) -> ApiToken | None:
        def run(conn: sqlite3.Connection) -> Row | None:
            row: Row | None = conn.execute(Q["revoke_token_by_name"], (now, name_or_id)).fetchone()
            if row is None and (number := as_id(name_or_id)) is not None:
                row = conn.execute(Q["revoke_token_by_id"], (now, number)).fetchone()
            return row

        row = await self._tx(run)
        return None if row is None else token_from(row)

    async def list_tokens(self, *, include_revoked: bool = False) -> list[ApiToken]:
        sql = "SELECT * FROM kirim_tokens"
        if not include_revoked:
            sql += " WHERE revoked_at IS NULL"
        rows = await self._tx(lambda c: c.execute(sql + " ORDER BY id").fetchall(), write=False)
        return [token_from(r) for r in rows]

    async def handle_requests(
        self,
        begin: Sequence[RequestBegin],
        enqueue: Sequence[RequestedDelivery],
        *,
        now: float,
        hold: float,
        respond: Respond,
    ) -> tuple[list[RequestSlot], list[tuple[EnqueueResult, StoredResponse | None]]]:
        def run(
            conn: sqlite3.Connection,
        ) -> tuple[list[RequestSlot], list[tuple[EnqueueResult, StoredResponse | None]]]:
            t = self._t(now)
            done = _enqueue_requests(conn, enqueue, t, respond) if enqueue else []
            return _begin_requests(conn, begin, t, hold), done

        return await self._tx(run)


def _begin_requests(
    conn: sqlite3.Connection, items: Sequence[RequestBegin], now: float, hold: float
) -> list[RequestSlot]:
    out = []
    for it in items:
        key, fp, token = it.idempotency_key, it.fingerprint, it.lock_token
        row = conn.execute(Q["insert_request"], (key, fp, token, now + hold, now, now)).fetchone()
        if row is None:
            row = conn.execute(
                Q["take_over_request"], (fp, token, now + hold, now, key, now)
            ).fetchone()
        if row is not None:
            out.append(RequestSlot(state=RequestState.ACQUIRED, fingerprint=fp))
            continue
        held = conn.execute(Q["request_by_key"], (key,)).fetchone()
        out.append(request_slot_from(held))
    return out


def _enqueue_requests(
    conn: sqlite3.Connection, items: Sequence[RequestedDelivery], now: float, respond: Respond
) -> list[tuple[EnqueueResult, StoredResponse | None]]:
    results = _enqueue(conn, [it.delivery for it in items], now)
    out = []
    for it, result in zip(items, results, strict=True):
        key = it.delivery.idempotency_key
        kept = respond(result)
        if kept is None:
            conn.execute(Q["release_request"], (key, it.lock_token))
        else:
            conn.execute(
                Q["complete_request"],
                (kept.status_code, kept.body, result.delivery.id, now, key, it.lock_token),
            )
        out.append((result, kept))
    return out


def _enqueue(
    conn: sqlite3.Connection, items: Sequence[NewDelivery], now: float
) -> list[EnqueueResult]:
    out = []
    for it in items:
        row = conn.execute(
            Q["insert_delivery"],
            (
                it.idempotency_key,
                it.event_id,
                it.recipient,
                it.channel,
                it.payload_json,
                it.payload_hash,
                now,
                now,
            ),
        ).fetchone()
        if row is None:
            existing = conn.execute(
                "SELECT * FROM kirim_deliveries WHERE idempotency_key = ?",
                (it.idempotency_key,),
            ).fetchone()
            out.append(
                EnqueueResult(
                    delivery=delivery_from(existing),
                    job=_latest_job(conn, existing["id"]),
                    created=False,
                )
            )
            continue
        run_at = now if it.run_at is None else it.run_at
        conn.execute(Q["insert_job"], (row["id"], run_at, it.max_attempts, now, now)).fetchone()
        delivery = conn.execute(
            "SELECT * FROM kirim_deliveries WHERE id = ?", (row["id"],)
        ).fetchone()
        out.append(
            EnqueueResult(
                delivery=delivery_from(delivery),
                job=_latest_job(conn, row["id"]),
                created=True,
            )
        )
    return out


def _latest_job(conn: sqlite3.Connection, delivery_id: int) -> Job | None:
    row = conn.execute(
        "SELECT * FROM kirim_jobs WHERE delivery_id = ? ORDER BY id DESC LIMIT 1", (delivery_id,)
    ).fetchone()
    return None if row is None else job_from(row)


def _version(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM kirim_meta WHERE key = 'schema_version'").fetchone()
    return parse_version(row[0]) if row else 0


def _statements(sql: str) -> list[str]:
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
