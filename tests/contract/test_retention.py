"""Retention on both backends: what prune deletes, what it keeps, and the keys it
remembers (tombstones) so that a pruned notification is still never sent twice."""

from __future__ import annotations

import asyncio
import sqlite3

import psycopg
import pytest

from http_kit import BODY, api_on
from kirim.engine import NotifyRequest
from kirim.model import AttemptStatus, DeliveryStatus, Doubt, JobStatus
from kirim.store.base import AttemptOutcome, Finish, Intent
from kirim.store.retention import PruneResult, Prunes, key_hash
from kirim.worker import WorkerSettings

LEASE = 10.0
DAY = 86_400.0
KEEP = 30 * DAY
KEYS = 365 * DAY


# -- helpers -----------------------------------------------------------------------------


def rows(url: str, sql: str) -> list[tuple]:
    """Read the database behind the store's back."""
    if url.startswith("sqlite:"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            return db.execute(sql).fetchall()
    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


def count(url: str, table: str) -> int:
    return int(rows(url, f"SELECT count(*) FROM {table}")[0][0])


async def claim_one(app):
    (c,) = await app.store.claim(worker_id="w1", now=app.clock.now(), lease=LEASE, limit=1)
    return c


async def record(app, c, *, settles_in: float = LEASE) -> str:
    """Write the attempt intent of claim ``c`` (settled ``settles_in`` seconds from now)."""
    request_id = f"req-{c.delivery.id}"
    now = app.clock.now()
    intent = Intent(
        delivery_id=c.delivery.id,
        job_id=c.job.id,
        token=c.token,
        number=c.job.attempts,
        provider_request_id=request_id,
        worker_id="w1",
        requested_at=now,
        send_deadline=now + LEASE / 2,
        settles_at=now + settles_in,
    )
    assert await app.store.record_intents([intent]) == [True]
    return request_id


async def finish(app, c, request_id: str | None, **kw) -> None:
    now = app.clock.now()
    outcome = (
        None
        if request_id is None
        else AttemptOutcome(
            provider_request_id=request_id,
            status=AttemptStatus.SUCCEEDED,
            provider_message_id="p-1",
            error=None,
            completed_at=now,
        )
    )
    fields = {"delivery_status": DeliveryStatus.SENT, "provider_message_id": "p-1", **kw}
    item = Finish(
        delivery_id=c.delivery.id,
        job_id=c.job.id,
        token=c.token,
        now=now,
        attempt=outcome,
        **fields,
    )
    (res,) = await app.store.finish([item])
    assert res.committed


async def sent(app, key: str) -> int:
    """A notification with ``key``, delivered: sent, its job completed, one attempt."""
    n = await app.notify(f"e-{key}", "u", "push", {"k": key}, key=key)
    c = await claim_one(app)
    await finish(app, c, await record(app, c))
    return n.delivery_id


async def newest(app) -> int:
    """A newer delivery (with its job and attempt), as a live ledger has: the rows that
    hold the newest ids always stay, so that SQLite never gives a pruned id again."""
    return await sent(app, "newest")


async def prune(app, *, limit: int = 500, dry_run: bool = False, keys: float = KEYS):
    return await app.store.prune(
        now=app.clock.now(), keep=KEEP, keys=keys, limit=limit, dry_run=dry_run
    )


# -- what goes, and the key that stays --------------------------------------------------


async def test_prune_removes_an_old_sent_delivery_and_leaves_a_tombstone(
    make_app, clock, database_url
) -> None:
    """Delivery, job and attempt go in one transaction; the key's sha256 stays."""
    app = await make_app()
    assert isinstance(app.store, Prunes)
    created_at = clock.now()
    delivery_id = await sent(app, "k-1")
    await newest(app)
    clock.advance(KEEP + 1)
    result = await prune(app)
    assert result == PruneResult(deliveries=1, attempts=1, jobs=1, tombstones_written=1)
    assert await app.store.get_delivery(str(delivery_id), by="id") is None
    assert (await app.store.counts()) == {"deliveries": {"sent": 1}, "jobs": {"completed": 1}}
    assert count(database_url, "kirim_attempts") == 1
    assert rows(
        database_url,
        "SELECT key_hash, delivery_id, status, seen_at, pruned_at FROM kirim_key_tombstones",
    ) == [(key_hash("k-1"), delivery_id, "sent", created_at, clock.now())]
    assert await prune(app) == PruneResult()  # nothing left to do


async def test_a_pruned_key_is_never_a_second_delivery(make_app, clock) -> None:
    """notify() with a pruned key whose tombstone is kept: created=False, pruned=True,
    the old delivery's id and status, and no row written."""
    app = await make_app()
    delivery_id = await sent(app, "k-1")
    await newest(app)
    clock.advance(KEEP + 1)
    assert (await prune(app)).deliveries == 1
    before = await app.store.counts()
    again = await app.notify("e-k-1", "u", "push", {"k": "k-1"}, key="k-1")
    assert (again.created, again.pruned) == (False, True)
    assert (again.delivery_id, again.status) == (delivery_id, DeliveryStatus.SENT)
    # what the key named is gone: another body cannot be told from the first one
    other = await app.notify("e-2", "u2", "push", {"other": True}, key="k-1")
    assert (other.created, other.pruned, other.delivery_id) == (False, True, delivery_id)
    item = app.prepare(
        NotifyRequest(event_id="e-k-1", recipient="u", channel="push", payload={}, key="k-1")
    )
    (result,) = await app.store.enqueue([item], now=clock.now())
    assert (result.created, result.pruned, result.job) == (False, True, None)
    assert result.delivery.id == delivery_id
    assert result.delivery.idempotency_key == "k-1"
    assert result.delivery.payload == {}
    assert await app.store.counts() == before


async def test_prune_keeps_what_is_not_finished_or_too_recent(
    make_app, clock, database_url
) -> None:
    """In doubt, an active job, an attempt that may still land, and a recent delivery
    stay; the old sent one goes. Once its attempt has settled, the third one goes too."""
    app = await make_app()
    gone = await sent(app, "old")

    await app.notify("e", "u", "push", {}, key="in-doubt")
    c = await claim_one(app)
    await record(app, c)
    await finish(
        app,
        c,
        None,
        delivery_status=DeliveryStatus.IN_DOUBT,
        doubt=Doubt.HELD,
        job_status=JobStatus.DEAD,
        provider_message_id=None,
    )

    await app.notify("e", "u", "push", {}, key="active-job")
    c = await claim_one(app)
    await finish(
        app,
        c,
        await record(app, c),
        job_status=JobStatus.RETRY_SCHEDULED,
        run_at=clock.now() + 400 * DAY,
    )

    await app.notify("e", "u", "push", {}, key="unsettled")
    c = await claim_one(app)
    await record(app, c, settles_in=KEEP + 10 * DAY)
    await finish(app, c, None, doubt=Doubt.ASSUMED_SENT, provider_message_id=None)
    unsettled = c.delivery.id

    clock.advance(KEEP + 1)
    await sent(app, "recent")
    kept = {"in-doubt", "active-job", "unsettled", "recent"}

    assert await prune(app) == PruneResult(deliveries=1, attempts=1, jobs=1, tombstones_written=1)
    assert await app.store.get_delivery(str(gone), by="id") is None
    for key in kept:
        assert await app.store.get_delivery(key, by="key") is not None, key
    assert (await app.store.attempts_of_many([unsettled]))[unsettled] != []

    clock.advance(10 * DAY)  # the unsettled attempt's settles_at has passed
    assert (await prune(app)).deliveries == 1
    assert await app.store.get_delivery("unsettled", by="key") is None
    for key in kept - {"unsettled"}:
        assert await app.store.get_delivery(key, by="key") is not None, key
    assert sorted(
        r[0] for r in rows(database_url, "SELECT key_hash FROM kirim_key_tombstones")
    ) == (sorted([key_hash("old"), key_hash("unsettled")]))


async def test_a_dry_run_counts_and_deletes_nothing(make_app, clock, database_url) -> None:
    """dry_run counts every delivery that would go (past any limit), with its rows."""
    app = await make_app()
    for i in range(3):
        await sent(app, f"k-{i}")
    await newest(app)
    clock.advance(KEEP + 1)
    before = await app.store.counts()
    dry = await prune(app, dry_run=True, limit=2)
    assert dry == PruneResult(deliveries=3, attempts=3, jobs=3, tombstones_written=3, dry_run=True)
    assert await app.store.counts() == before
    assert count(database_url, "kirim_attempts") == 4
    assert count(database_url, "kirim_key_tombstones") == 0
    first, second = await prune(app, limit=2), await prune(app, limit=2)
    assert first + second == PruneResult(deliveries=3, attempts=3, jobs=3, tombstones_written=3)


async def test_tombstones_past_keys_go_and_the_key_is_free_again(make_app, clock) -> None:
    """A tombstone older than ``keys`` is deleted; then the key makes a new delivery."""
    app = await make_app()
    first = await sent(app, "k-1")
    await newest(app)
    clock.advance(KEEP + 1)
    assert (await prune(app)).tombstones_written == 1
    clock.advance(KEYS - 1)
    assert (await prune(app)).tombstones_expired == 0
    assert (await app.notify("e-k-1", "u", "push", {"k": "k-1"}, key="k-1")).pruned
    clock.advance(2)
    assert (await prune(app, dry_run=True)).tombstones_expired == 1
    assert (await prune(app)).tombstones_expired == 1
    again = await app.notify("e-k-1", "u", "push", {"k": "k-1"}, key="k-1")
    assert (again.created, again.pruned) == (True, False)
    assert again.delivery_id != first


async def test_batches_are_bounded(make_app, clock, database_url) -> None:
    """limit=2 on 5 prunable deliveries: 2, 2, 1, each call saying whether more may be."""
    app = await make_app()
    for i in range(5):
        await sent(app, f"k-{i}")
    await newest(app)
    clock.advance(KEEP + 1)
    batches = [await prune(app, limit=2) for _ in range(4)]
    assert [(b.deliveries, b.more) for b in batches] == [
        (2, True),
        (2, True),
        (1, False),
        (0, False),
    ]
    assert count(database_url, "kirim_deliveries") == 1  # the newest
    assert count(database_url, "kirim_key_tombstones") == 5


async def test_failed_and_canceled_deliveries_go_too(make_app, clock) -> None:
    """A failed delivery whose job is dead, and a canceled one, are finished."""
    app = await make_app()
    await app.notify("e", "u", "push", {}, key="failed")
    c = await claim_one(app)
    await finish(
        app,
        c,
        None,
        delivery_status=DeliveryStatus.FAILED,
        job_status=JobStatus.DEAD,
        provider_message_id=None,
        error="refused",
    )
    canceled = await app.notify("e", "u", "push", {}, key="canceled")
    assert await app.store.cancel(canceled.delivery_id, now=clock.now())
    await newest(app)
    clock.advance(KEEP + 1)
    assert (await prune(app)).deliveries == 2
    statuses = {
        key: (await app.notify("e", "u", "push", {}, key=key)).status
        for key in ("failed", "canceled")
    }
    assert statuses == {"failed": DeliveryStatus.FAILED, "canceled": DeliveryStatus.CANCELED}


# -- the HTTP API -------------------------------------------------------------------------


async def test_the_api_answers_200_for_a_pruned_key(make_app, clock, database_url) -> None:
    """POST with a pruned key: 200 with the tombstone's delivery (id, key, status; no
    job, no attempts), nothing written; its request row went with the delivery."""
    app = await make_app()
    async with api_on(app) as api:
        first = await api.post(key="k-1")
        assert first.status_code == 201
        c = await claim_one(app)
        await finish(app, c, await record(app, c))
        await newest(app)
        clock.advance(KEEP + 1)
        assert (await prune(app)).requests == 1
        again = await api.post(key="k-1")
        assert again.status_code == 200, again.text
        assert "idempotent-replayed" not in again.headers
        data = again.json()
        assert (data["id"], data["idempotency_key"], data["status"]) == (
            first.json()["id"],
            "k-1",
            "sent",
        )
        assert (data["job"], data["attempts"], data["payload"]) == (None, [], {})
        assert data["created_at"] == first.json()["created_at"]
        assert (await api.post({**BODY, "payload": {"n": 2}}, key="k-1")).status_code == 200
        assert count(database_url, "kirim_deliveries") == 1  # the newest
        assert count(database_url, "kirim_requests") == 0


async def test_the_newest_rows_stay_so_that_no_id_is_given_twice(make_app, clock) -> None:
    """The delivery holding the newest delivery, job or attempt id is never pruned: a
    new delivery's id is above every pruned one (SQLite reuses the largest id + 1)."""
    app = await make_app()
    old = [await sent(app, f"k-{i}") for i in range(3)]
    clock.advance(KEEP + 1)
    assert (await prune(app)).deliveries == 2  # not the newest, old as it is
    assert await app.store.get_delivery(str(old[-1]), by="id") is not None
    # a delivery without an attempt yet: the newest attempt's delivery stays too
    fresh = await app.notify("e", "u", "push", {}, key="fresh")
    assert fresh.delivery_id > max(old)
    assert (await prune(app)).deliveries == 0
    later = await sent(app, "later")
    clock.advance(KEEP + 1)
    assert (await prune(app)).deliveries == 1  # old[-1]; "later" holds the newest ids
    assert await app.store.get_delivery(str(old[-1]), by="id") is None
    assert (await app.notify("e", "u", "push", {}, key="after")).delivery_id > later


async def test_the_worker_prunes_once_in_a_while(make_app, clock) -> None:
    """With retention_keep the reaper's round prunes (bounded batches), then waits."""
    app = await make_app()
    for i in range(3):
        await sent(app, f"k-{i}")
    await newest(app)
    clock.advance(KEEP + 1)
    idle = app.worker(settings=WorkerSettings())
    assert await idle.retain() is None  # no retention_keep: never
    worker = app.worker(settings=WorkerSettings(retention_keep=KEEP, retention_keys=KEYS))
    done = await worker.retain()
    assert done is not None
    assert (done.deliveries, done.tombstones_written) == (3, 3)
    assert await worker.retain() is None  # not before PRUNE_EVERY seconds


async def test_postgres_prune_skips_rows_another_transaction_holds(
    make_app, clock, database_url
) -> None:
    """PostgreSQL: a delivery (or its job) locked by another transaction is skipped,
    not waited for; the next prune takes it."""
    if not database_url.startswith("postgresql:"):
        pytest.skip("row locks: PostgreSQL only (SQLite serialises every writer)")
    app = await make_app()
    ids = [await sent(app, f"k-{i}") for i in range(3)]
    await newest(app)
    clock.advance(KEEP + 1)
    other = await psycopg.AsyncConnection.connect(database_url)
    async with other, other.transaction():
        await other.execute("SELECT 1 FROM kirim_jobs WHERE delivery_id = %s FOR UPDATE", (ids[0],))
        await other.execute(
            "SELECT 1 FROM kirim_deliveries WHERE id = %s FOR NO KEY UPDATE", (ids[1],)
        )
        done = await asyncio.wait_for(prune(app), timeout=10)
        assert done.deliveries == 1
        assert await app.store.get_delivery(str(ids[2]), by="id") is None
    assert (await prune(app)).deliveries == 2


async def test_a_pruned_key_answers_with_the_doubt_it_had(make_app, clock, database_url) -> None:
    """A delivery sent under the channel's assumption, pruned: asking for its key again
    answers ``sent (assumed)`` for as long as the tombstone lasts, through notify() and
    the HTTP API, never a plain ``sent`` (explorer finding: full workload seeds 31, 403;
    on main the tombstone kept only the status)."""
    app = await make_app()
    async with api_on(app) as api:
        first = await api.post(key="k-1")
        assert first.status_code == 201
        c = await claim_one(app)
        request_id = await record(app, c)
        now = clock.now()
        unknown = AttemptOutcome(
            provider_request_id=request_id,
            status=AttemptStatus.UNKNOWN,
            provider_message_id=None,
            error="timeout",
            completed_at=now,
        )
        (res,) = await app.store.finish(
            [
                Finish(
                    delivery_id=c.delivery.id,
                    job_id=c.job.id,
                    token=c.token,
                    now=now,
                    attempt=unknown,
                    delivery_status=DeliveryStatus.SENT,
                    doubt=Doubt.ASSUMED_SENT,
                )
            ]
        )
        assert res.committed
        await newest(app)
        clock.advance(KEEP + 1)
        assert (await prune(app)).deliveries == 1
        again = await app.notify("e-k-1", "u", "push", {"k": "k-1"}, key="k-1")
        assert (again.pruned, again.status, again.doubt) == (
            True,
            DeliveryStatus.SENT,
            Doubt.ASSUMED_SENT,
        )
        answer = await api.post(key="k-1")
        assert answer.status_code == 200
        assert (answer.json()["status"], answer.json()["doubt"]) == ("sent", "assumed_sent")
