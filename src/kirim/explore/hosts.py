"""Hosts: skewed clocks, the database of a schedule, and the worker processes.

Every worker host is a real ``Kirim`` app with its own store connection and a real
``Worker``, on one database. On SQLite each schedule gets a copy of a migrated
template file (``synchronous=off``: a schedule's file is thrown away anyway).
"""

from __future__ import annotations

import asyncio
import atexit
import random
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.explore import events
from kirim.explore.faults import Fault, FaultyStore
from kirim.explore.finishes import SQLITE_FINISH_AUDIT_SQL, Transactions
from kirim.explore.invariants import KEPT_CALLBACKS_SQL, PRUNED_WITH_TOMBSTONES_SQL, Ledger
from kirim.explore.loop import BASE, Host
from kirim.explore.takeover import Takeovers
from kirim.explore.topics import TopicsPlan, pace
from kirim.notify import NotificationType
from kirim.store.base import Store
from kirim.store.sqlite import SQLiteDriver, SQLiteStore
from kirim.worker import Worker, WorkerSettings

#: records, inside the inserting transaction, who held the claim when an intent was
#: written; every claim of a job (its new lease, in the claim's transaction, at the
#: claim's store time), which the ledger itself keeps only as a count; and every feed
#: message ever written (the inbox: retention and the recipient's deletes remove rows,
#: the audit keeps each write); and every workflow run ever started (retention deletes
#: runs over: the audit keeps each start)
AUDIT_SQL = """
CREATE TABLE explore_intent_audit (
    provider_request_id TEXT, worker_id TEXT, claim_token TEXT, claimed_by TEXT,
    delivery_status TEXT, lease_token TEXT, lease_owner TEXT, job_status TEXT);
CREATE TRIGGER explore_intent_audit AFTER INSERT ON kirim_attempts BEGIN
    INSERT INTO explore_intent_audit
    SELECT NEW.provider_request_id, NEW.worker_id, d.claim_token, d.claimed_by, d.status,
           j.lease_token, j.lease_owner, j.status
    FROM kirim_deliveries d, kirim_jobs j WHERE d.id = NEW.delivery_id AND j.id = NEW.job_id;
END;
CREATE TABLE explore_claim_audit (job_id INTEGER, delivery_id INTEGER, worker_id TEXT, at REAL);
CREATE TRIGGER explore_claim_audit AFTER UPDATE OF lease_token ON kirim_jobs
WHEN NEW.status = 'running' AND NEW.lease_token IS NOT NULL
     AND NEW.lease_token IS NOT OLD.lease_token BEGIN
    INSERT INTO explore_claim_audit
    VALUES (NEW.id, NEW.delivery_id, NEW.lease_owner, NEW.updated_at);
END;
CREATE TABLE explore_feed_audit (
    id INTEGER, recipient_id TEXT, idempotency_key TEXT, delivery_id INTEGER, created_at REAL);
CREATE TRIGGER explore_feed_audit AFTER INSERT ON kirim_feed BEGIN
    INSERT INTO explore_feed_audit
    VALUES (NEW.id, NEW.recipient_id, NEW.idempotency_key, NEW.delivery_id, NEW.created_at);
END;
CREATE TABLE explore_run_audit (
    id INTEGER, key TEXT, type TEXT, event_id TEXT, recipient_id TEXT, created_at REAL);
CREATE TRIGGER explore_run_audit AFTER INSERT ON kirim_runs BEGIN
    INSERT INTO explore_run_audit
    VALUES (NEW.id, NEW.key, NEW.type, NEW.event_id, NEW.recipient_id, NEW.created_at);
END;
"""


def pruned_audit(conn: sqlite3.Connection) -> str:
    """Triggers that keep a copy of every delivery and attempt row prune deletes
    (``explore_pruned_deliveries``, ``explore_pruned_attempts``): the invariants judge
    what a delivery was before it went."""
    out = []
    for table, copy in (
        ("kirim_deliveries", "explore_pruned_deliveries"),
        ("kirim_attempts", "explore_pruned_attempts"),
    ):
        columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
        names = ", ".join(columns)
        values = ", ".join(f"OLD.{c}" for c in columns)
        out.append(
            f"CREATE TABLE {copy} AS SELECT * FROM {table} WHERE 0;\n"
            f"CREATE TRIGGER {copy} AFTER DELETE ON {table} BEGIN\n"
            f"    INSERT INTO {copy} ({names}) VALUES ({values});\nEND;"
        )
    return "\n".join(out)


class SkewedClock:
    """A host's clock: ``now() = BASE + offset + rate * virtual time``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, offset: float = 0.0, rate: float = 1.0):
        self.loop = loop
        self.offset = offset
        self.rate = rate

    def now(self) -> float:
        return BASE + self.offset + self.rate * self.loop.time()

    def monotonic(self) -> float:
        return self.rate * self.loop.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.rate)


_TEMPLATES: dict[str, Path] = {}
_WORKDIR: list[Path] = []


def workdir() -> Path:
    """This process's scratch directory (in memory when /dev/shm exists), removed at exit."""
    if _WORKDIR and _WORKDIR[0].is_dir():
        return _WORKDIR[0]
    shm = Path("/dev/shm")
    path = Path(tempfile.mkdtemp(prefix="kirim-explore-", dir=shm if shm.is_dir() else None))
    _WORKDIR[:] = [path]
    atexit.register(shutil.rmtree, path, True)
    return path


def sqlite_template(directory: Path) -> Path:
    """A migrated SQLite file with the intent audit trigger (made once per directory)."""
    key = str(directory)
    if key in _TEMPLATES and _TEMPLATES[key].exists():
        return _TEMPLATES[key]
    path = directory / "template.db"

    async def migrate() -> None:
        store = SQLiteStore(f"sqlite:///{path}")
        await store.open()
        try:
            await store.migrate()
        finally:
            await store.close()

    asyncio.run(migrate())
    conn = sqlite3.connect(path)
    try:
        conn.executescript(AUDIT_SQL)
        conn.executescript(SQLITE_FINISH_AUDIT_SQL)
        conn.executescript(pruned_audit(conn))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    _TEMPLATES[key] = path
    return path


def new_sqlite_database(directory: Path, name: str) -> str:
    """A fresh copy of the template; its URL."""
    path = directory / f"{name}.db"
    shutil.copyfile(sqlite_template(directory), path)
    return f"sqlite:///{path}?synchronous=off"


def open_sqlite(url: str, true_clock: SkewedClock) -> SQLiteStore:
    """The real SQLite store, keeping time by the machine's (unskewed) clock: every host
    on one SQLite file shares one machine and so one clock; each worker has its own."""
    return SQLiteStore(url, time=true_clock)


class SQLiteDatabase:
    """One schedule's SQLite file (a copy of the template); every connection a store
    of it opens numbers its transactions for the finish audits
    (``kirim.explore.finishes.Transactions``)."""

    def __init__(self, directory: Path, name: str) -> None:
        self.url = new_sqlite_database(directory, name)
        self.path = self.url.removeprefix("sqlite:///").split("?")[0]
        self.stores: list[Any] = []
        self.transactions = Transactions()

    def open_store(self, true_clock: SkewedClock) -> Any:
        store = open_sqlite(self.url, true_clock)
        store.driver.on_connect = self.transactions.watch
        self.stores.append(store)
        return store

    def ledger(self) -> Ledger:
        return Ledger.read_sqlite(self.path)

    def active_jobs(self, *, before: float | None = None) -> int:
        """Jobs still to run (``before``: due before that store time, or running)."""
        conn = sqlite3.connect(self.path)
        try:
            if before is None:
                row = conn.execute(
                    "SELECT COUNT(*) FROM kirim_jobs "
                    "WHERE status IN ('queued', 'running', 'retry_scheduled')"
                ).fetchone()
            else:
                row = conn.execute(
                    "SELECT COUNT(*) FROM kirim_jobs WHERE status = 'running' "
                    "OR (status IN ('queued', 'retry_scheduled') AND run_at < ?)",
                    (before,),
                ).fetchone()
        finally:
            conn.close()
        return int(row[0])

    def waiting(self, now: float) -> dict[int, float]:
        """Deliveries whose jobs wait (queued or scheduled) past ``now``: id -> run_at."""
        conn = sqlite3.connect(self.path)
        try:
            rows = conn.execute(
                "SELECT delivery_id, MAX(run_at) FROM kirim_jobs "
                "WHERE status IN ('queued', 'retry_scheduled') AND run_at > ? "
                "GROUP BY delivery_id",
                (now,),
            ).fetchall()
        finally:
            conn.close()
        return {int(d): float(r) for d, r in rows}

    def kept_callbacks(self) -> int:
        """Kept callbacks (``kirim_callback_inbox``) that a delivery's message or key
        now matches: the reaper has yet to apply them."""
        conn = sqlite3.connect(self.path)
        try:
            if not conn.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'kirim_callback_inbox'"
            ).fetchone():
                return 0
            row = conn.execute(KEPT_CALLBACKS_SQL).fetchone()
        finally:
            conn.close()
        return int(row[0])

    def pruned_with_tombstones(self) -> list[dict[str, Any]]:
        """The pruned deliveries whose key's tombstone is still kept."""
        conn = sqlite3.connect(self.path)
        conn.row_factory = sqlite3.Row
        try:
            rows = conn.execute(PRUNED_WITH_TOMBSTONES_SQL).fetchall()
        finally:
            conn.close()
        return [dict(r) for r in rows]

    def dispose(self) -> None:
        close_leftovers(self.stores)
        for suffix in ("", "-wal", "-shm"):
            Path(self.path + suffix).unlink(missing_ok=True)


@dataclass(eq=False)
class WorkerHost:
    """One worker process; ``host`` is its current incarnation."""

    name: str
    host: Host
    clock: SkewedClock
    store: FaultyStore | None = None
    worker: Worker | None = None
    task: asyncio.Task[None] | None = None
    down: bool = False  # crashed or shut down, waiting for the heal


class PausePoints:
    """The worker's checkpoints as SIGSTOP points: a ``pause`` fault stalls the host
    when its worker reaches the checkpoint for the ``nth`` time; the schedule's
    ``takeover`` faults (``kirim.explore.takeover``) see every checkpoint too."""

    def __init__(
        self,
        loop: Any,
        host: Host,
        faults: list[Fault],
        note: Any,
        takeovers: Takeovers | None = None,
    ) -> None:
        self.loop = loop
        self.host = host
        self.faults = faults
        self.note = note
        self.takeovers = takeovers
        self.count: dict[str, int] = {}

    async def hit(self, name: str, *, worker_id: str, delivery_id: int, **context: Any) -> None:
        self.count[name] = self.count.get(name, 0) + 1
        for fault in self.faults:
            if fault.method == name and fault.nth == self.count[name]:
                self.note(f"fault pause at {name} delivery={delivery_id} for {fault.duration:.1f}s")
                self.loop.stall(self.host, self.loop.time() + fault.duration)
                await asyncio.sleep(0)
        if self.takeovers:
            await self.takeovers.hit(self.host, name, worker_id=worker_id, delivery_id=delivery_id)


async def run_worker(
    wh: WorkerHost,
    *,
    inner: Any,
    channels: dict[str, Channel],
    settings: WorkerSettings,
    config: Config,
    plan: list[Fault],
    heal: float,
    seed: int,
    on_intent: Any,
    note: Any,
    types: list[NotificationType] | None = None,
    topics: TopicsPlan | None = None,
    takeovers: Takeovers | None = None,
) -> None:
    """The life of one worker process: open its app, run its worker, close. ``types``:
    the notification types, whose policies and digest composers the worker gets as
    ``Kirim.worker()`` gives them. ``topics``: the worker expands topic events, in that
    plan's batches and pace (``kirim.explore.topics``). ``takeovers``: the schedule's
    ``takeover`` faults, shared by its workers."""
    loop = asyncio.get_running_loop()
    store = FaultyStore(
        inner,
        host=wh.name if wh.host.incarnation == 1 else wh.host.label,
        plan=plan,
        time=loop.time,
        heal=heal,
        on_intent=on_intent,
    )
    wh.store = store
    kinds = list(types or ())
    app = Kirim(config, store=cast(Store, store), channels=channels, clock=wh.clock, types=kinds)
    await app.open()
    worker = Worker(
        cast(Store, store),
        channels,
        settings=settings,
        worker_id=wh.host.label,
        clock=wh.clock,
        rng=random.Random(f"worker:{seed}:{wh.host.label}"),
        policies=events.policies(kinds),
        digests=events.digests(kinds),
        topics=None if topics is None else app.plan_topic_batch,
    )
    if topics is not None and worker.topics is not None:
        worker.topics.batch, worker.topics.before_batch = topics.batch, pace(topics)
    wh.worker = worker
    pauses = [f for f in plan if f.kind == "pause" and f.host == wh.host.label]
    if pauses or takeovers:
        worker.checkpoints = PausePoints(loop, wh.host, pauses, note, takeovers)
    await worker.run()
    await inner.close()


def close_leftovers(stores: list[Any]) -> None:
    """Close the connections of stores whose host died (a dead process's sockets)."""
    for store in stores:
        driver = getattr(store, "driver", None)
        if isinstance(driver, SQLiteDriver):
            driver.abandon()
