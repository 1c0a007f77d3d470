"""The PostgreSQL lane: the same schedules on a throw-away PostgreSQL database.

psycopg does real socket I/O, which a deterministic loop cannot schedule. So each
store call runs to completion on a private, real event loop in a helper thread
while the deterministic loop waits (``BlockingStore``): from the scheduler's view
one store call is one atomic step, as a SQLite transaction is. LISTEN/NOTIFY is
hidden (the workers poll). Each schedule gets ``CREATE DATABASE … TEMPLATE`` of a
migrated template; it is dropped afterwards. Slower: give it a smaller budget.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import secrets
import threading
from collections.abc import Coroutine
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit, urlunsplit

from kirim.explore.finishes import FINISH_AUDIT_SQL
from kirim.explore.invariants import KEPT_CALLBACKS_SQL, PRUNED_WITH_TOMBSTONES_SQL, Ledger

T = TypeVar("T")
HIDDEN = frozenset({"wait_for_jobs"})
#: who held the claim when each intent was written, inside the inserting statement
#: (``hosts.AUDIT_SQL``'s intent audit: ``fenced_intent`` and ``intent_first`` judge it)
INTENT_AUDIT_SQL = """
CREATE TABLE explore_intent_audit (
    provider_request_id text, worker_id text, claim_token text, claimed_by text,
    delivery_status text, lease_token text, lease_owner text, job_status text);
CREATE FUNCTION explore_intent_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO explore_intent_audit
    SELECT NEW.provider_request_id, NEW.worker_id, d.claim_token, d.claimed_by, d.status,
           j.lease_token, j.lease_owner, j.status
    FROM kirim_deliveries d, kirim_jobs j WHERE d.id = NEW.delivery_id AND j.id = NEW.job_id;
    RETURN NEW;
END $$;
CREATE TRIGGER explore_intent_audit AFTER INSERT ON kirim_attempts
FOR EACH ROW EXECUTE FUNCTION explore_intent_audit();
"""

#: every new lease of a job, in the claim's transaction (``hosts.AUDIT_SQL``'s claim
#: audit)
CLAIM_AUDIT_SQL = """
CREATE TABLE explore_claim_audit (
    job_id bigint, delivery_id bigint, worker_id text, at double precision);
CREATE FUNCTION explore_claim_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO explore_claim_audit
    VALUES (NEW.id, NEW.delivery_id, NEW.lease_owner, NEW.updated_at);
    RETURN NEW;
END $$;
CREATE TRIGGER explore_claim_audit AFTER UPDATE OF lease_token ON kirim_jobs
FOR EACH ROW WHEN (NEW.status = 'running' AND NEW.lease_token IS NOT NULL
                   AND NEW.lease_token IS DISTINCT FROM OLD.lease_token)
EXECUTE FUNCTION explore_claim_audit();
"""


#: a copy of every delivery and attempt row prune deletes (``hosts.pruned_audit``)
PRUNED_AUDIT_SQL = """
CREATE TABLE explore_pruned_deliveries (LIKE kirim_deliveries);
CREATE TABLE explore_pruned_attempts (LIKE kirim_attempts);
CREATE FUNCTION explore_pruned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'kirim_deliveries' THEN
        INSERT INTO explore_pruned_deliveries SELECT (OLD).*;
    ELSE
        INSERT INTO explore_pruned_attempts SELECT (OLD).*;
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER explore_pruned AFTER DELETE ON kirim_deliveries
FOR EACH ROW EXECUTE FUNCTION explore_pruned();
CREATE TRIGGER explore_pruned AFTER DELETE ON kirim_attempts
FOR EACH ROW EXECUTE FUNCTION explore_pruned();
"""


#: every workflow run ever started (``hosts.AUDIT_SQL``'s run audit)
RUN_AUDIT_SQL = """
CREATE TABLE explore_run_audit (
    id bigint, key text, type text, event_id text, recipient_id text,
    created_at double precision);
CREATE FUNCTION explore_run_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO explore_run_audit
    VALUES (NEW.id, NEW.key, NEW.type, NEW.event_id, NEW.recipient_id, NEW.created_at);
    RETURN NEW;
END $$;
CREATE TRIGGER explore_run_audit AFTER INSERT ON kirim_runs
FOR EACH ROW EXECUTE FUNCTION explore_run_audit();
"""


#: every feed message ever written (``hosts.AUDIT_SQL``'s feed audit)
FEED_AUDIT_SQL = """
CREATE TABLE explore_feed_audit (
    id bigint, recipient_id text, idempotency_key text, delivery_id bigint,
    created_at double precision);
CREATE FUNCTION explore_feed_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO explore_feed_audit
    VALUES (NEW.id, NEW.recipient_id, NEW.idempotency_key, NEW.delivery_id, NEW.created_at);
    RETURN NEW;
END $$;
CREATE TRIGGER explore_feed_audit AFTER INSERT ON kirim_feed
FOR EACH ROW EXECUTE FUNCTION explore_feed_audit();
"""


class Runner:
    """A real event loop in a daemon thread; ``run`` blocks until a coroutine is done."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)


_RUNNER: list[Runner] = []


def runner() -> Runner:
    if not _RUNNER:
        _RUNNER.append(Runner())
    return _RUNNER[0]


class BlockingStore:
    """Every coroutine method of ``inner`` as one atomic step of the deterministic loop."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    #: its workers poll (``HIDDEN``)
    listens = False

    def __getattr__(self, name: str) -> Any:
        if name in HIDDEN:
            raise AttributeError(name)
        attr = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0)  # the step at which the call happens is chosen
            return runner().run(attr(*args, **kwargs))

        return call


def _drop(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


class PostgresDatabase:
    """One throw-away database of a schedule, copied from a migrated template."""

    _templates: ClassVar[dict[str, str]] = {}

    def __init__(self, admin_url: str) -> None:
        import psycopg

        self.psycopg = psycopg
        self.admin_url = admin_url
        template = self._template()
        self.name = f"kirim_explore_{secrets.token_hex(5)}"
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}" TEMPLATE "{template}"')
        self.url = _with_db(admin_url, self.name)
        self.stores: list[Any] = []

    def _template(self) -> str:
        name = self._templates.get(self.admin_url)
        if name is not None:
            return name
        from kirim.store.postgres import PostgresStore

        name = f"kirim_explore_tpl_{secrets.token_hex(4)}"
        with self.psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

        async def migrate() -> None:
            store = PostgresStore(_with_db(self.admin_url, name))
            await store.open()
            try:
                await store.migrate()
            finally:
                await store.close()

        runner().run(migrate())
        with self.psycopg.connect(_with_db(self.admin_url, name), autocommit=True) as conn:
            conn.execute(CLAIM_AUDIT_SQL)
            conn.execute(INTENT_AUDIT_SQL)
            conn.execute(PRUNED_AUDIT_SQL)
            conn.execute(FEED_AUDIT_SQL)
            conn.execute(RUN_AUDIT_SQL)
            conn.execute(FINISH_AUDIT_SQL)
        self._templates[self.admin_url] = name
        atexit.register(_drop, self.admin_url, name)
        return name

    def open_store(self, true_clock: Any) -> Any:
        from kirim.store.postgres import PostgresStore

        # The database's clock, as one time line shared by every host: virtual time.
        inner = PostgresStore(self.url, time=true_clock)
        self.stores.append(inner)
        return BlockingStore(inner)

    def ledger(self) -> Ledger:
        from psycopg.rows import dict_row

        with self.psycopg.connect(self.url, row_factory=dict_row) as conn:

            def rows(sql: str) -> list[dict[str, Any]]:
                return [dict(r) for r in conn.execute(sql).fetchall()]

            live = rows("SELECT * FROM kirim_deliveries ORDER BY id")
            ids = {d["id"] for d in live}
            gone = [
                {**d, "explore_pruned": 1}
                for d in rows("SELECT * FROM explore_pruned_deliveries")
                if d["id"] not in ids
            ]
            attempts = rows("SELECT * FROM kirim_attempts ORDER BY id")
            seen = {a["id"] for a in attempts}
            attempts += [
                a for a in rows("SELECT * FROM explore_pruned_attempts") if a["id"] not in seen
            ]
            return Ledger(
                deliveries=sorted(live + gone, key=lambda d: d["id"]),
                attempts=sorted(attempts, key=lambda a: a["id"]),
                jobs=rows("SELECT * FROM kirim_jobs ORDER BY id"),
                audit=rows("SELECT * FROM explore_intent_audit"),
                digests=rows("SELECT * FROM kirim_digests ORDER BY key"),
                digest_events=rows("SELECT * FROM kirim_digest_events ORDER BY id"),
                claims=rows("SELECT * FROM explore_claim_audit"),
                feed_writes=rows("SELECT * FROM explore_feed_audit ORDER BY id"),
                feed_rows=rows("SELECT * FROM kirim_feed ORDER BY id"),
                runs=rows("SELECT * FROM explore_run_audit ORDER BY id"),
                releases=rows("SELECT * FROM explore_release_audit"),
                outcomes=rows("SELECT * FROM explore_outcome_audit"),
            )

    def active_jobs(self, *, before: float | None = None) -> int:
        """Jobs still to run (``before``: due before that store time, or running)."""
        with self.psycopg.connect(self.url) as conn:
            if before is None:
                row = conn.execute(
                    "SELECT COUNT(*) FROM kirim_jobs "
                    "WHERE status IN ('queued', 'running', 'retry_scheduled')"
                ).fetchone()
            else:
                row = conn.execute(
                    "SELECT COUNT(*) FROM kirim_jobs WHERE status = 'running' "
                    "OR (status IN ('queued', 'retry_scheduled') AND run_at < %s)",
                    (before,),
                ).fetchone()
        return int(row[0]) if row else 0

    def waiting(self, now: float) -> dict[int, float]:
        """Deliveries whose jobs wait (queued or scheduled) past ``now``: id -> run_at."""
        with self.psycopg.connect(self.url) as conn:
            rows = conn.execute(
                "SELECT delivery_id, MAX(run_at) FROM kirim_jobs "
                "WHERE status IN ('queued', 'retry_scheduled') AND run_at > %s "
                "GROUP BY delivery_id",
                (now,),
            ).fetchall()
        return {int(d): float(r) for d, r in rows}

    def kept_callbacks(self) -> int:
        """Kept callbacks (``kirim_callback_inbox``) that a delivery's message or key
        now matches: the reaper has yet to apply them (``hosts.SQLiteDatabase``'s twin)."""
        with self.psycopg.connect(self.url) as conn:
            row = conn.execute(KEPT_CALLBACKS_SQL).fetchone()
        return 0 if row is None else int(row[0])

    def pruned_with_tombstones(self) -> list[dict[str, Any]]:
        """The pruned deliveries whose key's tombstone is still kept (``hosts.
        SQLiteDatabase``'s twin: the tombstone probe runs on both lanes)."""
        from psycopg.rows import dict_row

        with self.psycopg.connect(self.url, row_factory=dict_row) as conn:
            return conn.execute(PRUNED_WITH_TOMBSTONES_SQL).fetchall()

    def dispose(self) -> None:
        for store in self.stores:  # a crashed host's pool is still open
            try:
                runner().run(store.close())
            except Exception:
                continue
        with self.psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
