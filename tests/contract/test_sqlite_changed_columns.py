"""The transitions' write-backs set only the columns that changed on SQLite (issue 24),
and leave the same rows as whole-row writes do on every backend."""

from __future__ import annotations

import re
import sqlite3
from typing import Any

import pytest

from kirim.model import AttemptStatus, DeliveryStatus, JobStatus
from kirim.store.base import AttemptOutcome, Finish
from kirim.store.sequence import Operation, Query
from notify_kit import intent_of

LEASE = 10.0
#: a job is written whole: each of its writes changes its status, which four of its
#: five indexes name, and setting fewer of its columns measured no faster
JOB_COLUMNS = (
    "status", "run_at", "attempts", "lease_owner", "lease_token", "lease_expires_at",
    "last_error", "updated_at",
)  # fmt: skip


async def _claimed(app: Any) -> Any:
    await app.notify("e1", "u1", "push", {"i": 1})
    (c,) = await app.store.claim(worker_id="w1", now=app.clock.now(), lease=LEASE, limit=10)
    return c


def _finish(c: Any, now: float) -> Finish:
    return Finish(
        delivery_id=c.delivery.id,
        job_id=c.job.id,
        token=c.token,
        now=now,
        attempt=AttemptOutcome(
            provider_request_id="req-1",
            status=AttemptStatus.SUCCEEDED,
            provider_message_id="p-1",
            error=None,
            completed_at=now,
        ),
        delivery_status=DeliveryStatus.SENT,
        provider_message_id="p-1",
        job_status=JobStatus.COMPLETED,
    )


class Traced:
    """Every statement the store's one SQLite connection runs, while on."""

    def __init__(self, app: Any) -> None:
        self.driver = app.store.driver
        self.seen: list[str] = []

    async def __aenter__(self) -> Traced:
        conn: sqlite3.Connection = self.driver._conn
        await self.driver._call(lambda: conn.set_trace_callback(self.seen.append))
        return self

    async def __aexit__(self, *exc: object) -> None:
        conn: sqlite3.Connection = self.driver._conn
        await self.driver._call(lambda: conn.set_trace_callback(None))

    def set_columns(self, table: str) -> set[str]:
        """The columns the UPDATEs of ``table`` set (one such statement expected)."""
        found = [s for s in self.seen if re.match(rf"\s*UPDATE {table}\b", s)]
        assert len(found) == 1, found
        clause = re.search(r"\bSET\b(.*?)\b(?:FROM|WHERE)\b", found[0], re.S)
        assert clause is not None, found[0]
        return set(re.findall(r"(?:^|,)\s*(\w+)\s*=", clause.group(1)))


async def _finished(app: Any, clock: Any, *, careful_only: bool = False) -> Traced:
    """A delivery claimed, its intent written, then finished sent, the finish traced
    (``careful_only``: the careful way)."""
    app.store.careful_only = careful_only
    c = await _claimed(app)
    assert await app.store.record_intents([intent_of(c)]) == [True]
    clock.advance(1.0)
    async with Traced(app) as traced:
        (res,) = await app.store.finish([_finish(c, clock.now())])
    assert res.committed
    return traced


def _sqlite_only(database_url: str) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("statement tracing: SQLite's trace callback")


async def test_a_claim_sets_only_the_columns_it_changes(make_app, database_url, clock) -> None:
    """A fresh delivery's claim (``claim_fresh``) sets the claim's columns of the delivery
    and of its job, not the whole rows."""
    _sqlite_only(database_url)
    app = await make_app()
    await app.notify("e1", "u1", "push", {"i": 1})
    clock.advance(1.0)
    async with Traced(app) as traced:
        (c,) = await app.store.claim(worker_id="w1", now=app.clock.now(), lease=LEASE, limit=10)
    assert c.delivery.status is DeliveryStatus.PROCESSING
    assert traced.set_columns("kirim_deliveries") == {
        "status", "claim_token", "claimed_by", "claim_expires_at", "updated_at",
    }  # fmt: skip
    assert traced.set_columns("kirim_jobs") == {
        "status", "attempts", "lease_owner", "lease_token", "lease_expires_at", "updated_at",
    }  # fmt: skip


async def test_a_careful_claim_sets_only_the_delivery_columns_it_changes(
    make_app, database_url, clock
) -> None:
    """A retry's claim (an earlier attempt: the careful claim, ``due_jobs``) writes the
    delivery's changed columns only (the job's are all named: ``JOB_COLUMNS``)."""
    _sqlite_only(database_url)
    app = await make_app()
    c = await _claimed(app)
    assert await app.store.record_intents([intent_of(c)]) == [True]
    retry = Finish(
        delivery_id=c.delivery.id,
        job_id=c.job.id,
        token=c.token,
        now=clock.now(),
        attempt=AttemptOutcome(
            provider_request_id="req-1",
            status=AttemptStatus.FAILED_TRANSIENT,
            provider_message_id=None,
            error="refused",
            completed_at=clock.now(),
        ),
        delivery_status=DeliveryStatus.PENDING,
        error="refused",
        job_status=JobStatus.RETRY_SCHEDULED,
        delay=0.0,
    )
    (res,) = await app.store.finish([retry])
    assert res.committed
    clock.advance(1.0)
    async with Traced(app) as traced:
        (again,) = await app.store.claim(worker_id="w2", now=app.clock.now(), lease=LEASE, limit=10)
    assert (again.delivery.status, again.prior_requests) == (DeliveryStatus.PROCESSING, 1)
    # claim_fresh's UPDATE (its fresh token made by randomblob) found no fresh delivery
    traced.seen = [s for s in traced.seen if "randomblob" not in s]
    assert traced.set_columns("kirim_deliveries") == {
        "status", "claim_token", "claimed_by", "claim_expires_at", "updated_at",
    }  # fmt: skip
    assert traced.set_columns("kirim_jobs") == set(JOB_COLUMNS)


async def test_a_careful_finish_sets_only_the_columns_it_changes(
    make_app, database_url, clock
) -> None:
    """A successful finish the careful way: its UPDATE of the delivery leaves out what
    stays as it was (the doubt, the error, the reason, the release time)."""
    _sqlite_only(database_url)
    traced = await _finished(await make_app(), clock, careful_only=True)
    assert traced.set_columns("kirim_deliveries") == {
        "status", "claim_token", "claimed_by", "claim_expires_at", "provider_message_id",
        "sent_at", "updated_at",
    }  # fmt: skip
    assert traced.set_columns("kirim_jobs") == set(JOB_COLUMNS)


async def test_a_fenced_finish_sets_no_column_an_index_names(make_app, database_url, clock) -> None:
    """The plain finish's statements (``finish_fenced``: the jobs, then the deliveries
    and the attempts, in one transaction) set the columns the commit writes
    (``rules.committed_columns``); of the delivery's and the attempt's, none that an
    index names, so that their writes touch no index (the job's status moves it between
    its partial indexes whatever is set)."""
    _sqlite_only(database_url)
    app = await make_app()
    traced = await _finished(app, clock)
    assert [s.split()[0] for s in traced.seen if s.split()[0] != "INSERT"] == [
        "BEGIN", "UPDATE", "UPDATE", "UPDATE", "COMMIT",
    ]  # fmt: skip
    delivery = traced.set_columns("kirim_deliveries")
    assert delivery == {
        "status", "doubt", "claim_token", "claimed_by", "claim_expires_at",
        "provider_message_id", "last_error", "sent_at", "reason", "updated_at",
    }  # fmt: skip
    attempt = traced.set_columns("kirim_attempts")
    assert attempt == {"status", "provider_message_id", "error", "completed_at"}
    assert traced.set_columns("kirim_jobs") == set(JOB_COLUMNS) - {"attempts"}
    conn: sqlite3.Connection = app.store.driver._conn
    for table, written in (("kirim_deliveries", delivery), ("kirim_attempts", attempt)):
        indexes = conn.execute(f"PRAGMA index_list({table})").fetchall()
        named = {
            column[2]
            for index in indexes
            for column in conn.execute(f"PRAGMA index_info({index[1]})").fetchall()
        }
        partial = [index[1] for index in indexes if index[4]]
        assert not written & named, (table, written & named)
        assert not partial, (table, partial)


async def test_the_rows_left_are_the_rows_decided(make_app, clock) -> None:
    """After a claim and a finish, every column written reads back as decided, and the
    columns not written as they were (every backend)."""
    app = await make_app()
    c = await _claimed(app)
    assert await app.store.record_intents([intent_of(c)]) == [True]
    clock.advance(1.0)
    (res,) = await app.store.finish([_finish(c, clock.now())])
    assert res.committed
    record = await app.get(c.delivery.id, by="id")
    assert record is not None
    d, job = record.delivery, record.job
    assert job is not None
    assert (d.status, d.claim_token, d.claimed_by, d.claim_expires_at) == (
        DeliveryStatus.SENT, None, None, None,
    )  # fmt: skip
    assert (d.provider_message_id, d.sent_at, d.updated_at) == ("p-1", clock.now(), clock.now())
    assert (d.doubt, d.last_error, d.created_at) == (None, None, c.delivery.created_at)
    assert (job.status, job.attempts, job.lease_token, job.run_at) == (
        JobStatus.COMPLETED, 1, None, c.job.run_at,
    )  # fmt: skip


def _rewrite(row: dict[str, Any]) -> Operation[int]:
    """Write ``row`` back over itself: nothing in it changed."""
    written = yield Query("write_jobs", {"items": [row]}, count=True, read=[row])
    return int(written)


async def test_a_write_with_nothing_changed_still_counts_its_row(make_app, database_url) -> None:
    """A row written back as it was read is still matched by the statement's WHERE and
    counted (SQLite: a statement that sets a column to itself)."""
    _sqlite_only(database_url)
    app = await make_app()
    c = await _claimed(app)
    row = {
        "id": c.job.id, "status": "running", "run_at": c.job.run_at, "attempts": 1,
        "lease_owner": "w1", "lease_token": c.token, "lease_expires_at": c.job.lease_expires_at,
        "last_error": None, "updated_at": c.job.updated_at,
    }  # fmt: skip
    async with Traced(app) as traced:
        assert await app.store.driver.run(_rewrite(row)) == 1
    assert traced.set_columns("kirim_jobs") == {"status"}
    assert await app.store.driver.run(_rewrite({**row, "id": c.job.id + 99})) == 0
