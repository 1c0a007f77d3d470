"""SQLite backend: one file, WAL, ``BEGIN IMMEDIATE`` for every write.

Each store owns one connection used from one dedicated thread, so a whole
transaction (a batch of claims, intents or outcomes) costs one hop off the event
loop. Several worker processes on one file are safe: writers serialise on the
database lock and wait up to ``busy_timeout``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time as _time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs, urlsplit

from kirim.addresses import Address
from kirim.errors import ConfigError, SchemaError, StoreError
from kirim.inbox import FeedAction, FeedCounts, FeedFilter, FeedItem, FeedMark, FeedPage
from kirim.keys import text_problem
from kirim.model import (
    Attempt,
    Delivery,
    DeliveryStatus,
    EnqueueResult,
    Job,
    Record,
    RecordFilter,
)
from kirim.preferences import Preferences, TypePolicy
from kirim.store import (
    addresses,
    digests,
    feed,
    feed_changes,
    imports,
    rates,
    recipients,
    retention,
    transitions,
)
from kirim.store.base import (
    SCHEMA_VERSION,
    ActivityBucket,
    ApiToken,
    Callback,
    CallbackResult,
    Claim,
    Compose,
    DeadLetter,
    Finish,
    FinishResult,
    Intent,
    Lease,
    NewDelivery,
    QueueStats,
    Reaped,
    Refuse,
    RequestBegin,
    RequestedDelivery,
    RequestSlot,
    Respond,
    StoredResponse,
    StoreTime,
    Waiting,
    waiting_from,
)
from kirim.store.feed_changes import FeedChanges
from kirim.store.rows import (
    Row,
    attempt_from,
    attempts_by_delivery,
    delivery_from,
    job_from,
    must,
    must_job,
    record_args,
    records_from,
    token_from,
)
from kirim.store.rules import queue_stats
from kirim.store.schema import check_version, parse_version, too_new
from kirim.store.sequence import At, Operation, callers_time, fixed_time
from kirim.store.sqlfiles import migrations
from kirim.store.sqlite import intake
from kirim.store.sqlite.driver import Q, drive
from kirim.text import redact_url
from kirim.validation import as_id

T = TypeVar("T")
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


class SQLiteStore:
    """The embedded backend (``sqlite:///kirim.db``)."""

    dialect = "sqlite"

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

    def _at(self) -> At:
        """The time of record of one transaction: the callers' own times, or one clock
        read once (inside the transaction, after its lock)."""
        if self.time is None:
            return callers_time
        return fixed_time(self._t(0.0))

    async def _op(self, op: Operation[T]) -> T:
        """Run a transition (``kirim.store.transitions``) in one write transaction."""
        return await self._tx(lambda conn: drive(op, conn, self._at()))

    async def _one(self, name: str, args: dict[str, Any] | None = None) -> Row | None:
        row: Row | None = await self._tx(
            lambda c: c.execute(Q[name], args or {}).fetchone(), write=False
        )
        return row

    async def _all(self, name: str, args: dict[str, Any] | None = None) -> list[Row]:
        rows: list[Row] = await self._tx(
            lambda c: c.execute(Q[name], args or {}).fetchall(), write=False
        )
        return rows

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

    # -- write path ---------------------------------------------------------------

    async def enqueue(
        self, items: Sequence[NewDelivery], *, now: float, refuse: Refuse | None = None
    ) -> list[EnqueueResult]:
        def run(conn: sqlite3.Connection) -> list[EnqueueResult]:
            results = intake.enqueue(conn, items, self._t(now))
            if refuse is not None:
                refuse(results)  # raising rolls back (``_tx``)
            return results

        return await self._tx(run)

    async def claim(
        self,
        *,
        worker_id: str,
        now: float,
        lease: float,
        limit: int,
        policies: Mapping[str, TypePolicy] | None = None,
    ) -> list[Claim]:
        return await self._op(transitions.claim(worker_id, now, lease, limit, policies))

    async def heartbeat(self, leases: Sequence[Lease], *, now: float, lease: float) -> list[bool]:
        return await self._op(transitions.heartbeat(leases, now, lease))

    async def record_intents(self, intents: Sequence[Intent]) -> list[bool]:
        return await self._op(transitions.record_intents(intents))

    async def finish(self, items: Sequence[Finish]) -> list[FinishResult]:
        return await self._op(transitions.finish(items))

    async def reap(self, *, now: float, in_commit: Collection[str] = ()) -> list[Reaped]:
        return await self._op(transitions.reap(now, in_commit))

    async def release(self, leases: Sequence[Lease], *, now: float) -> None:
        await self._op(transitions.release(leases, now))

    async def next_run_at(self) -> float | None:
        row = await self._one("next_run_at")
        return None if row is None or row["run_at"] is None else float(row["run_at"])

    async def next_due_in(self, *, now: float) -> float | None:
        def run(conn: sqlite3.Connection) -> float | None:
            row = conn.execute(Q["next_run_at"]).fetchone()
            due = None if row is None else row["run_at"]
            return None if due is None else float(due) - self._t(now)

        return await self._tx(run, write=False)

    async def in_flight(self) -> int:
        return int(must(await self._one("count_running"))["n"])

    async def waiting(self, *, now: float) -> Waiting:
        def run(conn: sqlite3.Connection) -> Waiting:
            return waiting_from(conn.execute(Q["waiting_jobs"], {"now": self._t(now)}).fetchall())

        return await self._tx(run, write=False)

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
                row = conn.execute(Q["delivery_by_key"], {"key": key_or_id}).fetchone()
            if row is None and number is not None:
                row = conn.execute(Q["delivery_by_id"], {"id": number}).fetchone()
            return None if row is None else delivery_from(row)

        return await self._tx(run, write=False)

    async def get_job(self, delivery_id: int) -> Job | None:
        row = await self._one("latest_job", {"delivery_id": delivery_id})
        return None if row is None else job_from(row)

    async def get_attempts(self, delivery_id: int) -> list[Attempt]:
        return [
            attempt_from(r) for r in await self._all("attempts_of", {"delivery_id": delivery_id})
        ]

    async def list_deliveries(
        self,
        *,
        status: DeliveryStatus | None = None,
        channel: str | None = None,
        after_id: int = 0,
        limit: int = 100,
    ) -> list[Delivery]:
        args = {
            "status": None if status is None else str(status),
            "channel": channel,
            "limit": limit,
            "after_id": after_id,
        }
        return [delivery_from(r) for r in await self._all("deliveries_after", args)]

    async def records(
        self, where: RecordFilter, *, cursor: int | None = None, limit: int = 50
    ) -> list[Record]:
        name, args = record_args(where, cursor, limit)

        def run(conn: sqlite3.Connection) -> list[Record]:  # one read transaction
            rows = conn.execute(Q[name], args).fetchall()
            ids = json.dumps([r["id"] for r in rows])
            return records_from(rows, conn.execute(Q["attempts_of_many"], {"ids": ids}).fetchall())

        return await self._tx(run, write=False)

    async def attempts_of_many(self, delivery_ids: Sequence[int]) -> dict[int, list[Attempt]]:
        return attempts_by_delivery(
            delivery_ids,
            await self._all("attempts_of_many", {"ids": json.dumps(list(delivery_ids))}),
        )

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        rows = await self._all("dead_letters", {"limit": limit})
        return [DeadLetter(delivery=delivery_from(r), job=must_job(r)) for r in rows]

    async def retry_dead(self, delivery_id: int, *, now: float, release: bool = True) -> bool:
        return await self._op(transitions.retry_dead(delivery_id, now, release))

    async def reconcile(
        self,
        delivery_id: int,
        *,
        now: float,
        found: bool,
        message_id: str | None,
        seen: int,
    ) -> bool:
        return await self._op(transitions.reconcile(delivery_id, now, found, message_id, seen))

    async def cancel(self, delivery_id: int, *, now: float) -> bool:
        return await self._op(transitions.cancel(delivery_id, now))

    async def confirm(self, callback: Callback) -> CallbackResult:
        return await self._op(transitions.confirm(callback))

    async def apply_kept_callbacks(self, *, now: float, limit: int = 100) -> list[CallbackResult]:
        return await self._op(transitions.apply_kept(now, limit))

    async def counts(self) -> dict[str, dict[str, int]]:
        def run(conn: sqlite3.Connection) -> dict[str, dict[str, int]]:
            d = conn.execute(Q["count_deliveries"]).fetchall()
            j = conn.execute(Q["count_jobs"]).fetchall()
            return {
                "deliveries": {r["status"]: r["n"] for r in d},
                "jobs": {r["status"]: r["n"] for r in j},
            }

        return await self._tx(run, write=False)

    async def queue_stats(self, *, now: float) -> QueueStats:
        def run(conn: sqlite3.Connection) -> QueueStats:
            rows = conn.execute(Q["deliveries_by_status_doubt"]).fetchall()
            t = self._t(now)
            due = conn.execute(Q["due_jobs_summary"], {"now": t}).fetchone()
            return queue_stats(rows, due["n"], due["oldest"], t)

        return await self._tx(run, write=False)

    async def search_deliveries(self, text: str, *, limit: int = 50) -> list[Delivery]:
        number = as_id(text) or -1
        args = {"id": number, "text": text, "limit": limit}
        return [delivery_from(r) for r in await self._all("search_deliveries", args)]

    async def figures(self) -> list[dict[str, Any]]:
        return [dict(r) for r in await self._all("figures")]

    async def activity(self, *, since: float, until: float, bucket: float) -> list[ActivityBucket]:
        if ActivityBucket.span(since=since, until=until, bucket=bucket) == 0:
            return []
        args = {"since": float(since), "until": float(until), "bucket": float(bucket)}
        found = await self._all("activity", args)
        return ActivityBucket.series(found, since=since, until=until, bucket=bucket)

    # -- the HTTP service: API tokens and idempotent requests ---------------------

    async def create_token(
        self, name: str, token_hash: str, *, prefix: str, now: float
    ) -> ApiToken | None:
        args = {"name": name, "hash": token_hash, "prefix": prefix, "now": now}
        row = await self._tx(lambda c: c.execute(Q["insert_token"], args).fetchone())
        return None if row is None else token_from(row)

    async def verify_token(self, token_hash: str) -> ApiToken | None:
        row = await self._one("token_by_hash", {"hash": token_hash})
        return None if row is None else token_from(row)

    async def revoke_token(self, name_or_id: str, *, now: float) -> ApiToken | None:
        def run(conn: sqlite3.Connection) -> Row | None:
            args = {"name": name_or_id, "now": now}
            row: Row | None = conn.execute(Q["revoke_token_by_name"], args).fetchone()
            if row is None and (number := as_id(name_or_id)) is not None:
                row = conn.execute(Q["revoke_token_by_id"], {"id": number, "now": now}).fetchone()
            return row

        row = await self._tx(run)
        return None if row is None else token_from(row)

    async def list_tokens(self, *, include_revoked: bool = False) -> list[ApiToken]:
        return [token_from(r) for r in await self._all("tokens", {"all": include_revoked})]

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
            done = intake.enqueue_requests(conn, enqueue, t, respond) if enqueue else []
            return intake.begin_requests(conn, begin, t, hold), done

        return await self._tx(run)

    async def enqueue_request(
        self,
        items: Sequence[NewDelivery],
        *,
        key: str,
        token: str,
        now: float,
        respond: Callable[[Sequence[EnqueueResult]], StoredResponse | None],
        fingerprint: str | None = None,
    ) -> list[EnqueueResult]:
        return await self._tx(
            lambda conn: intake.enqueue_request(
                conn, items, key, token, self._t(now), respond, fingerprint
            )
        )

    # -- recipients' preferences (``kirim.store.recipients``) ----------------------

    async def get_preferences(self, recipient_id: str) -> Preferences | None:
        return (await self.preferences_of([recipient_id])).get(recipient_id)

    async def preferences_of(self, recipient_ids: Sequence[str]) -> dict[str, Preferences]:
        op = recipients.preferences_of(recipient_ids)
        return await self._tx(lambda conn: drive(op, conn, self._at()), write=False)

    async def set_preferences(self, prefs: Preferences, *, now: float) -> Preferences:
        return await self._op(recipients.set_preferences(prefs, now))

    async def delete_preferences(self, recipient_id: str) -> bool:
        return await self._op(recipients.delete_preferences(recipient_id))

    # -- recipients' addresses (``kirim.store.addresses``) -------------------------

    async def add_address(
        self, recipient_id: str, channel: str, address: str, *, label: str | None, now: float
    ) -> Address:
        return await self._op(addresses.add_address(recipient_id, channel, address, label, now))

    async def addresses_of(self, recipient_ids: Sequence[str]) -> dict[str, list[Address]]:
        return await self._tx(
            lambda c: drive(addresses.addresses_of(recipient_ids), c, self._at()), write=False
        )

    async def list_addresses(self, recipient_id: str) -> list[Address]:
        return await self._tx(
            lambda c: drive(addresses.list_addresses(recipient_id), c, self._at()), write=False
        )

    async def retire_address(self, channel: str, address: str, *, reason: str, now: float) -> int:
        return await self._op(addresses.retire_address(channel, address, reason, now))

    async def remove_address(self, recipient_id: str, channel: str, address: str) -> bool:
        return await self._op(addresses.remove_address(recipient_id, channel, address))

    async def retired_addresses(self) -> dict[str, int]:
        return await self._tx(
            lambda c: drive(addresses.retired_addresses(), c, self._at()), write=False
        )

    # -- recipients' feeds, the in-app inbox (``kirim.store.feed``) -----------------

    async def feed_page(
        self, recipient_id: str, which: FeedFilter, limit: int, before: int | None
    ) -> FeedPage:
        return await self._tx(
            lambda c: drive(feed.page(recipient_id, which, limit, before), c, self._at()),
            write=False,
        )

    async def feed_counts(self, recipient_id: str) -> FeedCounts:
        return await self._tx(
            lambda c: drive(feed.counts(recipient_id), c, self._at()), write=False
        )

    async def feed_action(
        self, recipient_id: str, item_id: int, action: FeedAction, *, now: float
    ) -> tuple[FeedItem, bool] | None:
        return await self._op(feed.act(recipient_id, item_id, action, now))

    async def mark_feed(
        self, recipient_id: str, ids: Sequence[int] | None, mark: FeedMark, *, now: float
    ) -> int:
        return await self._op(feed.mark(recipient_id, ids, mark, now))

    async def delete_feed_item(self, recipient_id: str, item_id: int, *, now: float) -> bool:
        return await self._op(feed.delete(recipient_id, item_id, now))

    # -- the order of the feeds' changes (``kirim.store.feed_changes``) -------------

    async def feed_changes(self, recipient_id: str, after: int, limit: int) -> FeedChanges:
        return await self._read(feed_changes.changes_after(recipient_id, after, limit))

    async def feed_head(self, recipient_id: str) -> int:
        return await self._read(feed_changes.head(recipient_id))

    async def feed_last_number(self) -> int:
        return await self._read(feed_changes.last_number())

    async def _read(self, op: Operation[T]) -> T:
        """Run a reading operation in one read transaction."""
        return await self._tx(lambda c: drive(op, c, self._at()), write=False)

    # -- the notification layer: digests and provider request rates -----------------

    async def seal_digest(
        self, delivery_id: int, token: str, *, now: float, compose: Compose
    ) -> Delivery | None:
        return await self._op(digests.seal(delivery_id, token, now, compose))

    async def take_rate_slot(
        self, channel: str, rate: float, *, now: float, within: float | None = None
    ) -> float:
        return await self._op(rates.take_slot(channel, rate, now, within))

    # -- retention ----------------------------------------------------------------

    async def import_keys(
        self, keys: Sequence[str], *, now: float, dry_run: bool = False
    ) -> imports.ImportResult:
        """One batch of ``kirim.store.imports.import_keys``: one transaction (a dry run
        only reads)."""
        op = imports.import_keys(keys, now, dry_run)
        if dry_run:
            return await self._tx(lambda conn: drive(op, conn, self._at()), write=False)
        return await self._op(op)

    async def prune(
        self,
        *,
        now: float,
        keep: float,
        keys: float,
        limit: int = 500,
        dry_run: bool = False,
        archived: float | None = None,
    ) -> retention.PruneResult:
        """One batch of ``kirim.store.retention.prune``: one transaction (a dry run only
        reads, without the write lock)."""
        op = retention.prune(now, keep, keys, limit, dry_run, archived)
        if dry_run:
            return await self._tx(lambda conn: drive(op, conn, self._at()), write=False)
        return await self._op(op)


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
