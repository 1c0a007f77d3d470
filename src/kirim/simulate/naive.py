"""The write-up's original flow, as a worker of its own: the baseline kirim is measured against.

"Contoh alur yang bermasalah" (the problematic flow) of the seed, and nothing more::

    Worker A: ambil job #9381                        -- claim a job with a lease
    Worker A: cek notifications.status = 'pending'
    Worker A: kirim ke provider                      -- send
    Worker A: update notifications.status = 'sent'

A job's lease that expires puts it back in reach of the next claim (a visibility
timeout); a failed or timed-out send puts it back in the queue with a backoff.
There is no atomic delivery claim, no fencing token, no heartbeat, no attempt log
and no idempotency key (unless ``--idempotent``: then the stable key is sent, to
show what the provider-side fix alone does). With an ``smtp://HOST:PORT`` URL it sends
email instead (``kirim simulate --channel smtp``), as most senders do: aiosmtplib,
any error retried, a fresh Message-ID on every send (with ``--idempotent``, one
derived from the key). Tables ``naive_notifications`` and
``naive_jobs`` live beside kirim's in the same database.

Everything time-related is decided by the worker's own clock, as in the write-up:
the claim's "now", the lease's expiry and a retry's ``run_at``. ``--clock-offset S``
runs it on a clock S seconds off (``kirim simulate --clock-skew``), to show what a
host whose clock is ahead does to the leases of the others. It has no lookup.

Run as ``python -m kirim.simulate.naive --database URL --url URL --worker-id ID …``;
log lines use the seed's ``key=value`` pseudo-log, which ``kirim analyze`` reads.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import make_msgid
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiosmtplib
import httpx

from kirim.clock import Clock, SystemClock
from kirim.keys import default_key
from kirim.providers.smtp import message_id
from kirim.simulate.skew import OffsetClock

T = TypeVar("T")

_SCHEMA = {
    "sqlite": [
        """CREATE TABLE IF NOT EXISTS naive_notifications (
            id INTEGER PRIMARY KEY, key TEXT NOT NULL, event_id TEXT NOT NULL,
            recipient TEXT NOT NULL, channel TEXT NOT NULL, payload TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending', created_at REAL NOT NULL, sent_at REAL)""",
        """CREATE TABLE IF NOT EXISTS naive_jobs (
            id INTEGER PRIMARY KEY, notification_id INTEGER NOT NULL,
            status TEXT NOT NULL DEFAULT 'queued', run_at REAL NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0, max_attempts INTEGER NOT NULL,
            lease_owner TEXT, lease_expires_at REAL, last_error TEXT)""",
    ],
    "postgres": [
        """CREATE TABLE IF NOT EXISTS naive_notifications (
            id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, key TEXT NOT NULL,
            event_id TEXT NOT NULL, recipient TEXT NOT NULL, channel TEXT NOT NULL,
            payload TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending',
            created_at DOUBLE PRECISION NOT NULL, sent_at DOUBLE PRECISION)""",
        """CREATE TABLE IF NOT EXISTS naive_jobs (
            id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, notification_id BIGINT NOT NULL,
            status TEXT NOT NULL DEFAULT 'queued', run_at DOUBLE PRECISION NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0, max_attempts INTEGER NOT NULL,
            lease_owner TEXT, lease_expires_at DOUBLE PRECISION, last_error TEXT)""",
    ],
}
_INDEX = "CREATE INDEX IF NOT EXISTS naive_jobs_due ON naive_jobs (status, run_at)"

# "ambil job": a queued job that is due, or a running one whose lease has expired.
_CLAIM = """UPDATE naive_jobs
    SET status = 'running', lease_owner = ?, lease_expires_at = ?, attempts = attempts + 1
    WHERE id IN (SELECT id FROM naive_jobs
                 WHERE (status = 'queued' AND run_at <= ?)
                    OR (status = 'running' AND lease_expires_at < ?)
                 ORDER BY id LIMIT ?{lock})
    RETURNING id, notification_id, attempts, max_attempts"""


class NaiveDb:
    """One connection (sqlite3 or psycopg), used from one thread; ``?`` placeholders."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect = "sqlite" if url.startswith("sqlite:") else "postgres"
        self._conn: Any = None

    def connect(self) -> NaiveDb:
        if self.dialect == "sqlite":
            from kirim.store.sqlite import sqlite_path

            path, _ = sqlite_path(self.url)
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute("PRAGMA journal_mode = WAL")
            self._conn = conn
        else:
            import psycopg

            from kirim.store.postgres import postgres_conninfo

            # no server-side prepared statements: they break behind a transaction pooler
            conninfo = postgres_conninfo(self.url)[0]
            self._conn = psycopg.connect(conninfo, autocommit=True, prepare_threshold=None)
        return self

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _sql(self, sql: str) -> str:
        return sql if self.dialect == "sqlite" else sql.replace("?", "%s")

    def rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cur = self._conn.execute(self._sql(sql), tuple(args))
        return list(cur.fetchall()) if cur.description is not None else []

    def many(self, sql: str, args: Sequence[Sequence[Any]]) -> None:
        if self.dialect == "sqlite":
            self._conn.executemany(sql, args)
        else:
            with self._conn.cursor() as cur:
                cur.executemany(self._sql(sql), args)

    @contextlib.contextmanager
    def tx(self) -> Iterator[None]:
        if self.dialect == "postgres":
            with self._conn.transaction():
                yield
            return
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def create_tables(self) -> None:
        with self.tx():
            for statement in [*_SCHEMA[self.dialect], _INDEX]:
                self.rows(statement)

    def claim(
        self, worker_id: str, lease: float, limit: int, *, now: float | None = None
    ) -> list[tuple[Any, ...]]:
        """Due jobs and running ones whose lease expired, by ``now`` (the worker's clock)."""
        now = time.time() if now is None else now
        lock = "" if self.dialect == "sqlite" else " FOR UPDATE SKIP LOCKED"
        with self.tx():
            return self.rows(_CLAIM.format(lock=lock), (worker_id, now + lease, now, now, limit))


def enqueue(
    db: NaiveDb, notifications: Sequence[tuple[str, str, str, Any]], *, attempts: int
) -> None:
    """Record (event_id, recipient, channel, payload) notifications, each with a queued job."""
    now = time.time()
    with db.tx():
        first = db.rows("SELECT COALESCE(MAX(id), 0) FROM naive_notifications")[0][0]
        db.many(
            "INSERT INTO naive_notifications (key, event_id, recipient, channel, payload, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?)",
            [(default_key(e, r, c), e, r, c, json.dumps(p), now) for e, r, c, p in notifications],
        )
        db.rows(
            "INSERT INTO naive_jobs (notification_id, run_at, max_attempts) "
            "SELECT id, ?, ? FROM naive_notifications WHERE id > ? ORDER BY id",
            (now, attempts, first),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class NaiveRecord:
    """What the naive tables say about one notification at the end."""

    key: str
    status: str
    created_at: float
    attempts: int
    job_status: str


def collect(db: NaiveDb) -> list[NaiveRecord]:
    rows = db.rows(
        "SELECT n.key, n.status, n.created_at, j.attempts, j.status FROM naive_notifications n "
        "JOIN naive_jobs j ON j.notification_id = n.id ORDER BY n.id"
    )
    return [
        NaiveRecord(key=k, status=s, created_at=float(c), attempts=int(a), job_status=js)
        for k, s, c, a, js in rows
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class NaiveSettings:
    url: str
    worker_id: str
    lease: float = 2.0
    concurrency: int = 10
    timeout: float = 5.0
    idempotent: bool = False
    burst: bool = False
    poll: float = 0.05
    backoff_base: float = 0.05
    backoff_max: float = 0.5
    quiet: bool = False
    clock_offset: float = 0.0  # this worker's clock is that many seconds off
    #: a service channel's table (``kirim simulate --channel apns|fcm|webpush|sms``)
    service: dict[str, Any] | None = None


class NaiveWorker:
    """Claim with a lease, check pending, send, then mark sent. Nothing else."""

    def __init__(self, db: NaiveDb, settings: NaiveSettings, clock: Clock | None = None) -> None:
        self.db = db
        self.s = settings
        #: the worker's own clock: its leases and retries are decided by it
        self.clock: Clock = clock or (
            OffsetClock(settings.clock_offset) if settings.clock_offset else SystemClock()
        )
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="naive-db")
        self._tasks: set[asyncio.Task[None]] = set()
        self._rng = random.Random()
        self._provider: Any = None

    async def _call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def _log(self, *words: str, always: bool = False, **fields: Any) -> None:
        """One line of the seed's pseudo-log: ``2026-07-21T10:00:01.120Z worker=A …``."""
        if always or not self.s.quiet:
            now = time.time()
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
            text = " ".join([*(f"{k}={v}" for k, v in fields.items()), *words])
            print(f"{stamp}.{int(now * 1000) % 1000:03d}Z {text}", file=sys.stderr)

    async def run(self) -> None:
        headers = {"X-Worker-Id": self.s.worker_id}
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(timeout=self.s.timeout, limits=limits, headers=headers) as c:
            while True:
                free = self.s.concurrency - len(self._tasks)
                jobs = []
                if free > 0:
                    jobs = await self._call(
                        partial(
                            self.db.claim,
                            self.s.worker_id,
                            self.s.lease,
                            free,
                            now=self.clock.now(),
                        )
                    )
                for job in jobs:
                    task = asyncio.create_task(self._process(c, *job))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                if jobs:
                    continue
                if self.s.burst and not self._tasks and await self._call(self._nothing_left):
                    return
                await asyncio.sleep(self.s.poll)

    def _nothing_left(self) -> bool:
        rows = self.db.rows("SELECT COUNT(*) FROM naive_jobs WHERE status IN ('queued', 'running')")
        return int(rows[0][0]) == 0

    async def _process(self, client: httpx.AsyncClient, *job: Any) -> None:
        try:
            await self._deliver(client, *job)
        except Exception as exc:  # a database error: the lease expires and the job comes back
            self._log(worker=self.s.worker_id, job_id=job[0], error=repr(exc), always=True)

    async def _deliver(
        self, client: httpx.AsyncClient, job_id: int, nid: int, attempt: int, max_attempts: int
    ) -> None:
        log: dict[str, Any] = {"worker": self.s.worker_id, "job_id": job_id, "attempt": attempt}
        self._log(**log, status="start", notification_id=nid)
        rows = await self._call(
            lambda: self.db.rows(
                "SELECT status, key, event_id, recipient, channel, payload "
                "FROM naive_notifications WHERE id = ?",
                (nid,),
            )
        )
        status, key, event_id, recipient, channel, payload = rows[0]
        if status != "pending":  # cek notifications.status = 'pending'
            await self._call(lambda: self._job_done(job_id))
            return
        request_id = f"req-{uuid.uuid4().hex[:12]}"
        headers = {"X-Request-Id": request_id}
        if self.s.idempotent:
            headers["Idempotency-Key"] = key
        body = {
            "event_id": event_id,
            "recipient": recipient,
            "channel": channel,
            "payload": json.loads(payload),
        }
        self._log(**log, action="provider_request", request_id=request_id)
        if self.s.service is not None:
            error = await self._service(key, event_id, recipient, channel, body["payload"])
        elif self.s.url.startswith("smtp://"):
            error = await self._mail(key, recipient, body["payload"])
        else:
            error = await self._post(client, body, headers)
        if error is None:
            self._log(**log, action="provider_response", result="success")
            await self._call(lambda: self._mark_sent(job_id, nid))  # update status = 'sent'
            self._log("db_update", **log, status="sent")
            return
        self._log(**log, action="provider_response", result="error", error=error)
        delay = self._rng.uniform(0, min(self.s.backoff_max, self.s.backoff_base * 2**attempt))
        await self._call(lambda: self._retry(job_id, nid, attempt >= max_attempts, delay, error))

    async def _post(
        self, client: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]
    ) -> str | None:
        """POST the notification; what went wrong, if anything."""
        try:
            response = await client.post(self.s.url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            return type(exc).__name__
        return None if 200 <= response.status_code < 300 else f"HTTP_{response.status_code}"

    async def _service(
        self, key: str, event_id: str, recipient: str, channel: str, payload: dict[str, Any]
    ) -> str | None:
        """Send through kirim's provider of the service, as a sender without a key
        does: a fresh key (so a fresh collapse id) on every send (with
        ``--idempotent``, the notification's own key)."""
        from kirim.providers import registry
        from kirim.providers.base import Message

        if self._provider is None:
            table = dict(self.s.service or {})
            kind = table.pop("provider")
            self._provider = registry.build(kind, {**table, "user_agent": self.s.worker_id})
        message = Message(
            delivery_id=0,
            idempotency_key=key if self.s.idempotent else uuid.uuid4().hex,
            provider_request_id=uuid.uuid4().hex,
            event_id=event_id,
            recipient=recipient,
            channel=channel,
            payload=payload,
            attempt=1,
        )
        try:
            await asyncio.wait_for(self._provider.send(message), self.s.timeout)
        except Exception as exc:  # the naive flow retries any error
            return type(exc).__name__
        return None

    async def _mail(self, key: str, recipient: str, payload: dict[str, Any]) -> str | None:
        """Email the notification over SMTP as most senders do: a fresh Message-ID on
        every send (with ``--idempotent``, one derived from the key, as kirim's)."""
        server = urlsplit(self.s.url)
        mail = EmailMessage()
        mail["From"] = "Shop <shop@example.com>"
        mail["To"] = recipient
        mail["Subject"] = payload["subject"]
        mail["Message-ID"] = (
            message_id(key, "example.com")
            if self.s.idempotent
            else make_msgid(domain="example.com")
        )
        mail.set_content(payload["text"])
        try:
            await aiosmtplib.send(
                mail,
                hostname=server.hostname,
                port=server.port,
                timeout=self.s.timeout,
                local_hostname=self.s.worker_id,  # the receiver aims faults by it
                start_tls=False,
            )
        except (aiosmtplib.SMTPException, OSError) as exc:
            return type(exc).__name__
        return None

    def _job_done(self, job_id: int) -> None:
        self.db.rows(
            "UPDATE naive_jobs SET status = 'done', lease_owner = NULL WHERE id = ?", (job_id,)
        )

    def _mark_sent(self, job_id: int, nid: int) -> None:
        with self.db.tx():
            self.db.rows(
                "UPDATE naive_notifications SET status = 'sent', sent_at = ? WHERE id = ?",
                (self.clock.now(), nid),
            )
            self._job_done(job_id)

    def _retry(self, job_id: int, nid: int, dead: bool, delay: float, error: str) -> None:
        with self.db.tx():
            self.db.rows(
                "UPDATE naive_jobs SET status = ?, run_at = ?, last_error = ?, lease_owner = NULL "
                "WHERE id = ?",
                ("dead" if dead else "queued", self.clock.now() + delay, error, job_id),
            )
            if dead:
                self.db.rows(
                    "UPDATE naive_notifications SET status = 'failed' "
                    "WHERE id = ? AND status = 'pending'",
                    (nid,),
                )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kirim.simulate.naive", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--database", required=True, help="sqlite:///… or postgresql://…")
    parser.add_argument(
        "--url", required=True, help="The provider (receiver) URL: http://… or smtp://HOST:PORT."
    )
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=5.0, help="HTTP timeout, seconds.")
    parser.add_argument("--idempotent", action="store_true", help="Send the Idempotency-Key.")
    parser.add_argument("--burst", action="store_true", help="Exit when no job is left.")
    parser.add_argument(
        "--service",
        metavar="FILE",
        help="A JSON service channel table (apns, fcm, webpush, twilio): send through it.",
    )
    parser.add_argument("--quiet", action="store_true", help="No log lines.")
    parser.add_argument(
        "--clock-offset",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="Run on a clock this many seconds off the system's (leases and retries use it).",
    )
    args = parser.parse_args(argv)
    if not math.isfinite(args.clock_offset):
        parser.error(f"--clock-offset {args.clock_offset!r} is not a finite number of seconds")
    settings = NaiveSettings(
        url=args.url,
        worker_id=args.worker_id,
        lease=args.lease,
        concurrency=args.concurrency,
        timeout=args.timeout,
        idempotent=args.idempotent,
        burst=args.burst,
        quiet=args.quiet,
        clock_offset=args.clock_offset,
        service=None if args.service is None else json.loads(Path(args.service).read_text()),
    )
    db = NaiveDb(args.database).connect()
    try:
        asyncio.run(NaiveWorker(db, settings).run())
    except KeyboardInterrupt:
        return 130
    finally:
        db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
