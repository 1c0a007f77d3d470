"""PostgreSQL backend: psycopg 3 async on a connection pool, for many worker hosts.

Batch claims lease due jobs with ``FOR NO KEY UPDATE SKIP LOCKED`` and claim their
deliveries in one statement; intents, heartbeats and the common outcomes are one
statement per batch (see ``postgres_ops`` and ``sql/postgres/queries.sql``). Pool
connections run in autocommit, so a single statement is a transaction of its own
and costs one round trip; what needs more runs inside an explicit transaction.

Beyond the Store protocol: ``wait_for_jobs`` (LISTEN/NOTIFY wake-ups) and
``enqueue_in`` (enqueue inside the application's own transaction, an outbox).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from typing import Any, Literal, TypeVar

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

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
from kirim.store.pooler import Wakeups
from kirim.store.postgres import intake
from kirim.store.postgres.connect import SESSIONLESS, Conn, configure, postgres_conninfo, probe
from kirim.store.postgres.driver import Cursor, drive, one, rows
from kirim.store.postgres.ledger import LedgerWatch
from kirim.store.postgres.listen import Listener
from kirim.store.rows import (
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
from kirim.store.sequence import Operation
from kirim.store.sqlfiles import migrations
from kirim.text import redact_url as redact
from kirim.text import scrub
from kirim.validation import MAX_ID

T = TypeVar("T")


class PostgresStore:
    """The shared backend (``postgresql://user@host/db``)."""

    dialect = "postgres"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        time: StoreTime = None,
        listen_url: str | None = None,
    ) -> None:
        """``time``: the time of record (``StoreTime``); None takes each caller's ``now``,
        "database" the server's clock (``kirim_now()`` in every statement).
        ``listen_url``: where to LISTEN for wake-ups (None: on ``url``), a direct
        connection when ``url`` goes through a pooler in transaction mode."""
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
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._listener = Listener(self._listen_conninfo, connect_timeout=timeout)
        #: the intents committed lately, checked after a lost connection (``ledger``)
        self.ledger = LedgerWatch()

    @property
    def listen_conninfo(self) -> str:
        """Where a LISTEN goes (``listen_url``, else ``url``)."""
        return self._listen_conninfo

    # -- plumbing -----------------------------------------------------------------

    def _t(self, now: float) -> float | None:
        """The time of record to pass: None lets ``kirim_now()`` read the server's clock."""
        if self.time is None:
            return float(now)
        if self.time == "database":
            return None
        return float(self.time.now())

    async def open(self) -> None:
        """Connect (one attempt first, so that a missing server or database is one
        ``ConfigError`` within the URL's ``connect_timeout``, else ``timeout``), then
        open the pool."""
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
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self.conninfo,
            min_size=self.min_size,
            max_size=self.max_size,
            timeout=self.timeout,
            open=False,
            connection_class=psycopg.AsyncConnection[DictRow],
            kwargs=SESSIONLESS | {"autocommit": True, "row_factory": dict_row},
            configure=configure,
            name="kirim",
        )
        try:
            await pool.open(wait=True, timeout=self.timeout)
        except psycopg.Error as exc:
            await pool.close()
            why = scrub(str(exc), self.url)
            raise StoreError(f"PostgreSQL: cannot connect to {redact(self.url)}: {why}") from exc
        self._pool = pool

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
    async def _cursor(self, *, transaction: bool) -> AsyncIterator[Cursor]:
        """A cursor on a pool connection, in one transaction or in autocommit."""
        if self._pool is None:
            raise StoreError("store is not open")
        try:
            async with self._pool.connection() as conn:
                if self.ledger.pending:  # back after a lost connection: is the ledger whole?
                    async with conn.cursor() as cur:
                        await self.ledger.check(cur)
                if transaction:
                    async with conn.transaction(), conn.cursor() as cur:
                        yield cur
                else:
                    async with conn.cursor() as cur:
                        yield cur
        except psycopg.Error as exc:
            raise await self._failed(exc) from exc

    def _tx(self) -> contextlib.AbstractAsyncContextManager[Cursor]:
        return self._cursor(transaction=True)

    def _auto(self) -> contextlib.AbstractAsyncContextManager[Cursor]:
        return self._cursor(transaction=False)

    async def _rows(self, name: str, args: dict[str, Any] | None = None) -> list[DictRow]:
        async with self._auto() as cur:
            return await rows(cur, name, args)

    async def _op(self, op: Operation[T]) -> T:
        """Run a transition (``kirim.store.transitions``) in one transaction."""
        async with self._tx() as cur:
            return await drive(op, cur, self.time)

    # -- schema -------------------------------------------------------------------

    async def migrate(self) -> int:
        async with self._tx() as cur:
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
        async with self._auto() as cur:
            found = await one(cur, "meta_exists")
            return await _version(cur) if found and found["present"] else 0

    async def check_schema(self) -> None:
        check_version(redact(self.url), await self.schema_version())

    # -- write path ---------------------------------------------------------------

    async def enqueue(
        self, items: Sequence[NewDelivery], *, now: float, refuse: Refuse | None = None
    ) -> list[EnqueueResult]:
        async with self._tx() as cur:
            results = await intake.enqueue(cur, items, self._t(now))
            if refuse is not None:
                refuse(results)  # raising rolls back (``_tx``)
            return results

    async def enqueue_in(
        self, conn: psycopg.AsyncConnection[Any], items: Sequence[NewDelivery], *, now: float
    ) -> list[EnqueueResult]:
        """Enqueue inside the caller's open transaction on ``conn``; nothing is committed.

        The deliveries (and the workers' wake-up) exist when, and only if, the caller
        commits; a rollback leaves no trace.
        """
        try:
            async with conn.cursor(row_factory=dict_row) as cur:
                return await intake.enqueue(cur, items, self._t(now))
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL: {exc}") from exc

    async def claim(
        self,
        *,
        worker_id: str,
        now: float,
        lease: float,
        limit: int,
        policies: Mapping[str, TypePolicy] | None = None,
    ) -> list[Claim]:
        if limit == 0:
            return []
        return await self._op(transitions.claim(worker_id, now, lease, _limit(limit), policies))

    async def heartbeat(self, leases: Sequence[Lease], *, now: float, lease: float) -> list[bool]:
        if not leases:
            return []
        return await self._op(transitions.heartbeat(leases, now, lease))

    async def record_intents(self, intents: Sequence[Intent]) -> list[bool]:
        if not intents:
            return []
        done = await self._op(transitions.record_intents(intents))
        self.ledger.committed(intents, done)
        return done

    async def finish(self, items: Sequence[Finish]) -> list[FinishResult]:
        if not items:
            return []
        return await self._op(transitions.finish(items))

    async def reap(self, *, now: float, in_commit: Collection[str] = ()) -> list[Reaped]:
        return await self._op(transitions.reap(now, in_commit))

    async def release(self, leases: Sequence[Lease], *, now: float) -> None:
        if leases:
            await self._op(transitions.release(leases, now))

    async def next_run_at(self) -> float | None:
        found = await self._rows("next_run_at")
        return None if not found or found[0]["run_at"] is None else float(found[0]["run_at"])

    async def next_due_in(self, *, now: float) -> float | None:
        found = await self._rows("next_due_in", {"now": self._t(now)})
        return None if not found or found[0]["due_in"] is None else float(found[0]["due_in"])

    async def in_flight(self) -> int:
        return int((await self._rows("count_running"))[0]["n"])

    async def waiting(self, *, now: float) -> Waiting:
        return waiting_from(await self._rows("waiting_jobs", {"now": self._t(now)}))

    # -- LISTEN/NOTIFY ------------------------------------------------------------

    async def wait_for_jobs(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait until a job may have become claimable (an enqueue, a retry, a released
        or reaped lease, here or on any host): True when notified, False on timeout.

        Listens on a dedicated connection, kept between calls so that a notification
        that arrives while the caller is busy wakes the next call at once. When that
        connection was lost, the call that notices it (or the one that listens again)
        returns True: something may have been missed, so the caller should poll. While
        the database is unreachable it waits ``timeout`` and returns False.
        """
        if self._pool is None:
            raise StoreError("store is not open")
        return await self._listener.wait(timeout)

    # -- read path and operator actions -------------------------------------------

    async def get_delivery(
        self, key_or_id: str, *, by: Literal["auto", "id", "key"] = "auto"
    ) -> Delivery | None:
        if by not in ("auto", "id", "key"):
            raise ValueError(f"by must be 'auto', 'id' or 'key', not {by!r}")
        # PostgreSQL text cannot hold NUL (nor a lone surrogate): no key has one
        as_key = by != "id" and text_problem(key_or_id) is None
        number = _as_id(key_or_id) if by != "key" else None
        row = None
        async with self._auto() as cur:
            if as_key:
                row = await one(cur, "delivery_by_key", {"key": key_or_id})
            if row is None and number is not None:
                row = await one(cur, "delivery_by_id", {"id": number})
        return None if row is None else delivery_from(row)

    async def get_job(self, delivery_id: int) -> Job | None:
        found = await self._rows("latest_job", {"delivery_id": delivery_id})
        return job_from(found[0]) if found else None

    async def get_attempts(self, delivery_id: int) -> list[Attempt]:
        return [
            attempt_from(r) for r in await self._rows("attempts_of", {"delivery_id": delivery_id})
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
            "limit": _limit(limit),
            "after_id": after_id,
        }
        return [delivery_from(r) for r in await self._rows("deliveries_after", args)]

    async def records(
        self, where: RecordFilter, *, cursor: int | None = None, limit: int = 50
    ) -> list[Record]:
        name, args = record_args(where, cursor, limit)
        async with self._tx() as cur:  # one transaction: the page, then its attempts
            found = await rows(cur, name, args)
            ids = [r["id"] for r in found]
            return records_from(found, await rows(cur, "attempts_of_many", {"ids": ids}))

    async def attempts_of_many(self, delivery_ids: Sequence[int]) -> dict[int, list[Attempt]]:
        return attempts_by_delivery(
            delivery_ids, await self._rows("attempts_of_many", {"ids": list(delivery_ids)})
        )

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        found = await self._rows("dead_letters", {"limit": _limit(limit)})
        return [DeadLetter(delivery=delivery_from(r), job=must_job(r)) for r in found]

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
        async with self._tx() as cur:
            d = await rows(cur, "count_deliveries")
            j = await rows(cur, "count_jobs")
        return {
            "deliveries": {r["status"]: int(r["n"]) for r in d},
            "jobs": {r["status"]: int(r["n"]) for r in j},
        }

    async def queue_stats(self, *, now: float) -> QueueStats:
        async with self._auto() as cur:
            by_status = await rows(cur, "deliveries_by_status_doubt")
            t = must(await one(cur, "store_now", {"now": self._t(now)}))["now"]
            due = await one(cur, "due_jobs_summary", {"now": t})
        assert due is not None
        return queue_stats(by_status, int(due["n"]), due["oldest"], float(t))

    async def search_deliveries(self, text: str, *, limit: int = 50) -> list[Delivery]:
        if "\x00" in text:  # PostgreSQL text cannot hold NUL: nothing matches
            return []
        number = _as_id(text)
        args = {"id": -1 if number is None else number, "text": text, "limit": _limit(limit)}
        return [delivery_from(r) for r in await self._rows("search_deliveries", args)]

    async def figures(self) -> list[dict[str, Any]]:
        return [dict(r) for r in await self._rows("figures")]

    async def activity(self, *, since: float, until: float, bucket: float) -> list[ActivityBucket]:
        if ActivityBucket.span(since=since, until=until, bucket=bucket) == 0:
            return []
        args = {"since": float(since), "until": float(until), "bucket": float(bucket)}
        found = await self._rows("activity", args)
        return ActivityBucket.series(found, since=since, until=until, bucket=bucket)

    # -- the HTTP service: API tokens and idempotent requests ---------------------

    async def create_token(
        self, name: str, token_hash: str, *, prefix: str, now: float
    ) -> ApiToken | None:
        args = {"name": name, "hash": token_hash, "prefix": prefix, "now": self._t(now)}
        found = await self._rows("insert_token", args)
        return token_from(found[0]) if found else None

    async def verify_token(self, token_hash: str) -> ApiToken | None:
        found = await self._rows("token_by_hash", {"hash": token_hash})
        return token_from(found[0]) if found else None

    async def revoke_token(self, name_or_id: str, *, now: float) -> ApiToken | None:
        if "\x00" in name_or_id:
            return None
        async with self._tx() as cur:
            t = self._t(now)
            row = await one(cur, "revoke_token_by_name", {"name": name_or_id, "now": t})
            number = _as_id(name_or_id) if row is None else None
            if number is not None:
                row = await one(cur, "revoke_token_by_id", {"id": number, "now": t})
        return None if row is None else token_from(row)

    async def list_tokens(self, *, include_revoked: bool = False) -> list[ApiToken]:
        return [token_from(r) for r in await self._rows("tokens", {"all": include_revoked})]

    async def handle_requests(
        self,
        begin: Sequence[RequestBegin],
        enqueue: Sequence[RequestedDelivery],
        *,
        now: float,
        hold: float,
        respond: Respond,
    ) -> tuple[list[RequestSlot], list[tuple[EnqueueResult, StoredResponse | None]]]:
        if not begin and not enqueue:
            return [], []
        async with self._tx() as cur:
            t = self._t(now)
            done = await intake.enqueue_requests(cur, enqueue, t, respond) if enqueue else []
            slots = await intake.begin_requests(cur, begin, t, hold) if begin else []
        return slots, done

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
        async with self._tx() as cur:
            return await intake.enqueue_request(
                cur, items, key, token, self._t(now), respond, fingerprint
            )

    # -- recipients' preferences (``kirim.store.recipients``) ----------------------

    async def get_preferences(self, recipient_id: str) -> Preferences | None:
        return (await self.preferences_of([recipient_id])).get(recipient_id)

    async def preferences_of(self, recipient_ids: Sequence[str]) -> dict[str, Preferences]:
        ids = [r for r in recipient_ids if "\x00" not in r]  # text cannot hold NUL: none has one
        if not ids:
            return {}
        return await self._op(recipients.preferences_of(ids))

    async def set_preferences(self, prefs: Preferences, *, now: float) -> Preferences:
        return await self._op(recipients.set_preferences(prefs, now))

    async def delete_preferences(self, recipient_id: str) -> bool:
        if "\x00" in recipient_id:
            return False
        return await self._op(recipients.delete_preferences(recipient_id))

    # -- recipients' addresses (``kirim.store.addresses``) -------------------------

    async def add_address(
        self, recipient_id: str, channel: str, address: str, *, label: str | None, now: float
    ) -> Address:
        return await self._op(addresses.add_address(recipient_id, channel, address, label, now))

    async def addresses_of(self, recipient_ids: Sequence[str]) -> dict[str, list[Address]]:
        return await self._op(addresses.addresses_of(recipient_ids))

    async def list_addresses(self, recipient_id: str) -> list[Address]:
        return await self._op(addresses.list_addresses(recipient_id))

    async def retire_address(self, channel: str, address: str, *, reason: str, now: float) -> int:
        return await self._op(addresses.retire_address(channel, address, reason, now))

    async def remove_address(self, recipient_id: str, channel: str, address: str) -> bool:
        return await self._op(addresses.remove_address(recipient_id, channel, address))

    async def retired_addresses(self) -> dict[str, int]:
        return await self._op(addresses.retired_addresses())

    # -- recipients' feeds, the in-app inbox (``kirim.store.feed``) -----------------

    async def feed_page(
        self, recipient_id: str, which: FeedFilter, limit: int, before: int | None
    ) -> FeedPage:
        return await self._op(feed.page(recipient_id, which, limit, before))

    async def feed_counts(self, recipient_id: str) -> FeedCounts:
        return await self._op(feed.counts(recipient_id))

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
        return await self._op(feed_changes.changes_after(recipient_id, after, limit))

    async def feed_head(self, recipient_id: str) -> int:
        return await self._op(feed_changes.head(recipient_id))

    async def feed_last_number(self) -> int:
        return await self._op(feed_changes.last_number())

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
        """One batch of ``kirim.store.imports.import_keys``, in one transaction."""
        return await self._op(imports.import_keys(keys, now, dry_run))

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
        """One batch of ``kirim.store.retention.prune``, in one transaction."""
        return await self._op(retention.prune(now, keep, keys, limit, dry_run, archived))


def _as_id(text: str) -> int | None:
    """The id a digit string names, as SQLite reads it (None when it cannot be one)."""
    if not text.isdigit():
        return None
    try:
        number = int(text)
    except ValueError:
        return None
    return number if number <= MAX_ID else None


def _limit(limit: int) -> int | None:
    """SQLite's LIMIT: a negative limit means none (NULL in PostgreSQL)."""
    return None if limit < 0 else limit


async def _version(cur: Cursor) -> int:
    row = await one(cur, "schema_version")
    return parse_version(row["value"]) if row else 0
