"""The store contract: every backend passes the same tests on a real database."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends import POOLED, backend_url
from kirim.errors import SchemaError
from kirim.model import AttemptStatus, DeliveryStatus, Doubt, JobStatus, RecordFilter
from kirim.store import open_store
from kirim.store.base import SCHEMA_VERSION, AttemptOutcome, ClaimKind, Finish, Lease
from notify_kit import intent_of as intent

LEASE = 10.0


@pytest.fixture(params=POOLED)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database of each backend, and one reached through PgBouncer in
    transaction pooling mode: the worker's store calls keep nothing in a session."""
    return backend_url(request, tmp_path)


async def enqueue(app, n: int = 1, **kw):
    return [await app.notify(f"e{i}", f"u{i}", "push", {"i": i}, **kw) for i in range(n)]


async def claim(app, worker: str = "w1", limit: int = 10):
    return await app.store.claim(worker_id=worker, now=app.clock.now(), lease=LEASE, limit=limit)


def finish(
    c,
    status=DeliveryStatus.SENT,
    *,
    request_id="req-1",
    outcome=AttemptStatus.SUCCEEDED,
    job=JobStatus.COMPLETED,
    now=0.0,
    run_at=None,
    message_id="p-1",
):
    return Finish(
        delivery_id=c.delivery.id,
        job_id=c.job.id,
        token=c.token,
        now=now,
        attempt=None
        if outcome is None
        else AttemptOutcome(
            provider_request_id=request_id,
            status=outcome,
            provider_message_id=message_id if outcome is AttemptStatus.SUCCEEDED else None,
            error=None,
            completed_at=now,
        ),
        delivery_status=status,
        provider_message_id=message_id,
        job_status=job,
        run_at=run_at,
    )


async def test_schema_check_asks_for_init(database_url) -> None:
    """A database without the schema is refused with a message naming `kirim init`."""
    store = open_store(database_url)
    await store.open()
    try:
        with pytest.raises(SchemaError, match="kirim init"):
            await store.check_schema()
        assert await store.migrate() == SCHEMA_VERSION
        assert await store.migrate() == SCHEMA_VERSION  # idempotent
        await store.check_schema()
    finally:
        await store.close()


async def test_enqueue_same_key_returns_existing(make_app) -> None:
    """The unique index, not a check in Python, keeps one delivery per key."""
    app = await make_app()
    first = await app.notify("e", "u", "push", {"a": 1})
    again = await app.notify("e", "u", "push", {"a": 1})
    assert first.created
    assert not again.created
    assert first.delivery_id == again.delivery_id
    assert (await app.store.counts())["jobs"] == {"queued": 1}


async def test_claim_leases_due_jobs_once(make_app, clock) -> None:
    """A leased job is not claimed again until its lease expires and it is reaped."""
    app = await make_app()
    await enqueue(app, 3)
    got = await claim(app, limit=2)
    assert [c.kind for c in got] == [ClaimKind.CLAIMED] * 2
    assert all(c.delivery.status is DeliveryStatus.PROCESSING for c in got)
    assert all(c.job.attempts == 1 and c.job.lease_token == c.token for c in got)
    assert all(c.delivery.claim_token == c.token for c in got)
    rest = await claim(app, "w2")
    assert len(rest) == 1
    assert await claim(app, "w3") == []
    assert await app.store.in_flight() == 3
    clock.advance(LEASE + 1)
    assert await claim(app, "w3") == []  # expired but not yet reaped
    reaped = await app.store.reap(now=clock.now())
    assert sorted(r.owner for r in reaped) == ["w1", "w1", "w2"]
    again = await claim(app, "w3")
    assert len(again) == 3
    assert all(c.job.attempts == 2 for c in again)
    assert {c.token for c in again}.isdisjoint({c.token for c in got + rest})


async def test_scheduled_jobs_wait_until_due(make_app, clock) -> None:
    """A job with a future run_at is not claimed before it is due."""
    app = await make_app()
    await app.notify("e", "u", "push", {}, send_after=clock.now() + 60)
    assert await claim(app) == []
    assert await app.store.next_run_at() == clock.now() + 60
    clock.advance(61)
    assert len(await claim(app)) == 1


async def test_intent_is_fenced_by_the_claim_token(make_app, clock) -> None:
    """Only the current claim holder can write an attempt intent."""
    app = await make_app()
    await enqueue(app)
    (old,) = await claim(app)
    clock.advance(LEASE + 1)
    await app.store.reap(now=clock.now())
    (new,) = await claim(app, "w2")
    assert await app.store.record_intents([intent(old, "req-old"), intent(new, "req-new")]) == [
        False,
        True,
    ]
    attempts = (await app.store.attempts_of_many([new.delivery.id]))[new.delivery.id]
    assert [a.provider_request_id for a in attempts] == ["req-new"]


async def test_heartbeat_extends_and_reports_lost_leases(make_app, clock) -> None:
    """Renewal moves the expiry forward; a stale token is reported lost."""
    app = await make_app()
    await enqueue(app)
    (c,) = await claim(app)
    lease = Lease(job_id=c.job.id, delivery_id=c.delivery.id, token=c.token)
    clock.advance(LEASE * 0.9)
    assert await app.store.heartbeat([lease], now=clock.now(), lease=LEASE) == [True]
    clock.advance(LEASE * 0.9)
    assert await app.store.reap(now=clock.now()) == []
    job = await app.store.get_job(c.delivery.id)
    assert job.lease_expires_at == pytest.approx(clock.now() - LEASE * 0.9 + LEASE)
    stale = Lease(job_id=c.job.id, delivery_id=c.delivery.id, token="not-the-token")
    assert await app.store.heartbeat([stale], now=clock.now(), lease=LEASE) == [False]


async def test_finish_commits_outcome_status_and_job_together(make_app, clock) -> None:
    """A fenced finish writes the attempt, the delivery and the job at once."""
    app = await make_app()
    await enqueue(app)
    (c,) = await claim(app)
    await app.store.record_intents([intent(c)])
    (res,) = await app.store.finish([finish(c, now=clock.now())])
    assert res.committed
    assert res.delivery_status is DeliveryStatus.SENT
    record = await app.get(c.delivery.id)
    d, job, attempts = record.delivery, record.job, record.attempts
    assert d.status is DeliveryStatus.SENT
    assert d.provider_message_id == "p-1"
    assert d.claim_token is None
    assert d.sent_at == clock.now()
    assert job.status is JobStatus.COMPLETED
    assert job.lease_token is None
    assert attempts[0].status is AttemptStatus.SUCCEEDED


async def test_stale_failure_is_rejected_but_recorded(make_app, clock) -> None:
    """A stale worker's failure changes no status, yet its attempt outcome is kept."""
    app = await make_app()
    await enqueue(app)
    (old,) = await claim(app)
    await app.store.record_intents([intent(old, "req-old")])
    clock.advance(LEASE + 1)
    await app.store.reap(now=clock.now())
    (new,) = await claim(app, "w2")
    (res,) = await app.store.finish(
        [
            finish(
                old,
                DeliveryStatus.FAILED,
                request_id="req-old",
                outcome=AttemptStatus.FAILED_PERMANENT,
                job=JobStatus.DEAD,
            )
        ]
    )
    assert not res.committed
    assert not res.late_success
    record = await app.get(new.delivery.id)
    d, job, attempts = record.delivery, record.job, record.attempts
    assert d.status is DeliveryStatus.PROCESSING
    assert d.claim_token == new.token
    assert job.status is JobStatus.RUNNING
    assert attempts[0].status is AttemptStatus.FAILED_PERMANENT


async def test_late_success_resolves_a_held_delivery(make_app, clock) -> None:
    """A success arriving after the delivery was parked in doubt makes it sent."""
    app = await make_app()
    await enqueue(app)
    (old,) = await claim(app)
    await app.store.record_intents([intent(old, "req-old")])
    clock.advance(LEASE + 1)
    await app.store.reap(now=clock.now())
    (new,) = await claim(app, "w2")
    assert [a.provider_request_id for a in new.doubtful] == ["req-old"]
    hold = Finish(
        delivery_id=new.delivery.id,
        job_id=new.job.id,
        token=new.token,
        now=clock.now(),
        attempt=None,
        delivery_status=DeliveryStatus.IN_DOUBT,
        doubt=Doubt.HELD,
        job_status=JobStatus.DEAD,
    )
    assert (await app.store.finish([hold]))[0].committed
    (res,) = await app.store.finish([finish(old, request_id="req-old", message_id="p-9")])
    assert res.late_success
    assert not res.committed
    record = await app.get(new.delivery.id)
    d, job = record.delivery, record.job
    assert d.status is DeliveryStatus.SENT
    assert d.doubt is Doubt.RESOLVED
    assert d.provider_message_id == "p-9"
    assert job.status is JobStatus.COMPLETED
    assert await app.store.dead_letters() == []


async def test_an_outcome_without_message_id_keeps_the_one_recorded(make_app, clock) -> None:
    """A request first answered `unknown` with a provider message id, then resolved as
    succeeded without one (by a later claim, as a lookup would), keeps that id."""
    app = await make_app()
    await enqueue(app)
    (first,) = await claim(app)
    await app.store.record_intents([intent(first, "req-1")])
    unknown = Finish(
        delivery_id=first.delivery.id,
        job_id=first.job.id,
        token=first.token,
        now=clock.now(),
        attempt=AttemptOutcome(
            provider_request_id="req-1",
            status=AttemptStatus.UNKNOWN,
            provider_message_id="p-1",
            error="timeout",
            completed_at=clock.now(),
        ),
        delivery_status=DeliveryStatus.PENDING,
        job_status=JobStatus.RETRY_SCHEDULED,
        run_at=clock.now(),
    )
    assert (await app.store.finish([unknown]))[0].committed
    (second,) = await claim(app, "w2")
    resolved = finish(second, request_id="req-1", message_id=None)
    assert (await app.store.finish([resolved]))[0].committed
    (attempt,) = (await app.store.attempts_of_many([first.delivery.id]))[first.delivery.id]
    assert attempt.status is AttemptStatus.SUCCEEDED
    assert attempt.provider_message_id == "p-1"


async def test_failure_never_overrides_a_recorded_success(make_app, clock) -> None:
    """If any attempt succeeded, a later failure still leaves the delivery sent."""
    app = await make_app()
    await enqueue(app)
    (old,) = await claim(app)
    await app.store.record_intents([intent(old, "req-old")])
    clock.advance(LEASE + 1)
    await app.store.reap(now=clock.now())
    (new,) = await claim(app, "w2")
    await app.store.record_intents([intent(new, "req-new")])
    await app.store.finish([finish(old, request_id="req-old")])  # late success first
    (_res,) = await app.store.finish(
        [
            finish(
                new,
                DeliveryStatus.FAILED,
                request_id="req-new",
                outcome=AttemptStatus.FAILED_PERMANENT,
                job=JobStatus.DEAD,
            )
        ]
    )
    d = (await app.get(new.delivery.id)).delivery
    assert d.status is DeliveryStatus.SENT


async def test_late_success_after_reaping_ends_the_job(make_app, clock) -> None:
    """A success reported after the lease was reaped completes the requeued job too."""
    app = await make_app()
    await enqueue(app)
    (c,) = await claim(app)
    await app.store.record_intents([intent(c)])
    # The worker's success arrives after its lease expired and was reaped.
    clock.advance(LEASE + 1)
    await app.store.reap(now=clock.now())
    stale = Finish(
        delivery_id=c.delivery.id,
        job_id=c.job.id,
        token="gone",
        now=clock.now(),
        attempt=AttemptOutcome(
            provider_request_id="req-1",
            status=AttemptStatus.SUCCEEDED,
            provider_message_id="p-1",
            error=None,
            completed_at=clock.now(),
        ),
        delivery_status=DeliveryStatus.SENT,
    )
    (res,) = await app.store.finish([stale])
    assert res.late_success
    assert await claim(app, "w2") == []  # the late success completed the job too
    record = await app.get(c.delivery.id)
    d, job = record.delivery, record.job
    assert d.status is DeliveryStatus.SENT
    assert job.status is JobStatus.COMPLETED


async def test_reaper_kills_a_job_on_its_final_attempt(make_app, clock) -> None:
    """A lease expiring on the last attempt dead-letters the job; a sent-maybe delivery
    is parked in doubt, a never-sent one fails."""
    app = await make_app(max_attempts=1)
    await enqueue(app, 2)
    c1, c2 = await claim(app, limit=2)
    await app.store.record_intents([intent(c1)])
    clock.advance(LEASE + 1)
    reaped = await app.store.reap(now=clock.now())
    assert all(r.dead for r in reaped)
    record = await app.get(c1.delivery.id)
    d1, j1 = record.delivery, record.job
    record = await app.get(c2.delivery.id)
    d2, j2 = record.delivery, record.job
    assert (d1.status, d1.doubt, j1.status) == (DeliveryStatus.IN_DOUBT, Doubt.HELD, JobStatus.DEAD)
    assert (d2.status, j2.status) == (DeliveryStatus.FAILED, JobStatus.DEAD)


async def test_retry_dead_releases_doubt_and_requeues(make_app, clock) -> None:
    """An operator retry makes a fresh job and earlier attempts no longer count as doubt."""
    app = await make_app(max_attempts=1)
    await enqueue(app)
    (c,) = await claim(app)
    await app.store.record_intents([intent(c)])
    clock.advance(LEASE + 1)
    await app.store.reap(now=clock.now())
    assert [x.delivery.id for x in await app.store.dead_letters()] == [c.delivery.id]
    clock.advance(1)
    assert await app.store.retry_dead(c.delivery.id, now=clock.now())
    assert not await app.store.retry_dead(c.delivery.id, now=clock.now())  # not dead now
    assert await app.store.dead_letters() == []
    (again,) = await claim(app)
    assert again.kind is ClaimKind.CLAIMED
    assert again.doubtful == ()
    assert again.job.id != c.job.id


async def test_cancel_only_what_is_not_in_flight(make_app, clock) -> None:
    """Pending deliveries can be canceled; in-flight and sent ones cannot."""
    app = await make_app()
    a, b = await enqueue(app, 2)
    assert await app.store.cancel(a.delivery_id, now=clock.now())
    (c,) = await claim(app)
    assert c.delivery.id == b.delivery_id
    assert not await app.store.cancel(b.delivery_id, now=clock.now())
    record = await app.get(a.delivery_id)
    d, job = record.delivery, record.job
    assert d.status is DeliveryStatus.CANCELED
    assert job.status is JobStatus.COMPLETED


async def test_release_hands_work_back_at_once(make_app, clock) -> None:
    """Leases released at shutdown are claimable immediately; the claim still counts."""
    app = await make_app()
    await enqueue(app)
    (c,) = await claim(app)
    lease = Lease(job_id=c.job.id, delivery_id=c.delivery.id, token=c.token)
    await app.store.release([lease], now=clock.now())
    (again,) = await claim(app, "w2")
    assert again.kind is ClaimKind.CLAIMED
    assert again.job.attempts == 2


async def test_list_filters_and_pages(make_app, clock) -> None:
    """records filters by status and channel and pages by id."""
    app = await make_app()
    made = await enqueue(app, 5)
    await app.store.cancel(made[0].delivery_id, now=clock.now())
    where = RecordFilter(status=DeliveryStatus.PENDING, oldest_first=True)
    pending = await app.store.records(where, limit=2)
    assert [r.delivery.id for r in pending] == [m.delivery_id for m in made[1:3]]
    more = await app.store.records(where, cursor=pending[-1].delivery.id, limit=10)
    assert [r.delivery.id for r in more] == [m.delivery_id for m in made[3:]]
    assert await app.store.records(RecordFilter(channel="sms")) == []
    assert (await app.store.get_delivery(made[1].idempotency_key)).id == made[1].delivery_id
    assert await app.store.get_delivery("no-such-key") is None


async def test_a_released_delivery_can_be_canceled(make_app, clock) -> None:
    """A delivery whose claim was revoked at shutdown is not in flight: cancel works."""
    app = await make_app()
    (n,) = await enqueue(app)
    (c,) = await claim(app)
    lease = Lease(job_id=c.job.id, delivery_id=c.delivery.id, token=c.token)
    await app.store.release([lease], now=clock.now())
    assert await app.store.cancel(n.delivery_id, now=clock.now())
    assert await claim(app) == []


async def test_get_delivery_by_id_or_by_key(make_app) -> None:
    """by="id" and by="key" never mix up a key of digits and an id; auto tries the key first."""
    app = await make_app()
    plain = await app.notify("e1", "u", "push", {}, key="k-a")
    digits = await app.notify("e2", "u", "push", {}, key=str(plain.delivery_id))
    named = str(plain.delivery_id)
    assert (await app.store.get_delivery(named)).id == digits.delivery_id
    assert (await app.store.get_delivery(named, by="key")).id == digits.delivery_id
    assert (await app.store.get_delivery(named, by="id")).id == plain.delivery_id
    assert (await app.store.get_delivery(str(digits.delivery_id))).id == digits.delivery_id
    assert await app.store.get_delivery(str(digits.delivery_id), by="key") is None
    assert await app.store.get_delivery("k-a", by="id") is None
    assert await app.store.get_delivery(str(2**63), by="id") is None
    with pytest.raises(ValueError, match="by must be"):
        await app.store.get_delivery("k-a", by="name")


@pytest.mark.parametrize("key", ["a\ud800b", "\udfff"])
async def test_get_delivery_of_a_lone_surrogate_key_is_none(make_app, key) -> None:
    """A key with a lone surrogate (no UTF-8 form) names no delivery, on every backend."""
    app = await make_app()
    await enqueue(app)
    assert await app.store.get_delivery(key) is None
    assert await app.store.get_delivery(key, by="key") is None


def _set_schema_version(url: str, value: str) -> None:
    """Write ``value`` into kirim_meta's schema_version behind the store's back."""
    if url.startswith("sqlite:"):
        import sqlite3

        from kirim.store.sqlite import sqlite_path

        with sqlite3.connect(sqlite_path(url)[0]) as db:
            db.execute("UPDATE kirim_meta SET value = ? WHERE key = 'schema_version'", (value,))
        db.close()
        return
    import psycopg

    from kirim.store.postgres import postgres_conninfo

    with psycopg.connect(postgres_conninfo(url)[0], autocommit=True) as conn:
        conn.execute("UPDATE kirim_meta SET value = %s WHERE key = 'schema_version'", (value,))


@pytest.mark.parametrize("version", ["abc", "", "-1", "3.0", "9" * 40])
async def test_a_corrupt_schema_version_is_a_schema_error(database_url, version) -> None:
    """A schema version that is not a version number makes check_schema and migrate raise
    a one-line SchemaError on every backend (not a ValueError)."""
    store = open_store(database_url)
    await store.open()
    try:
        await store.migrate()
        _set_schema_version(database_url, version)
        for step in (store.check_schema, store.migrate):
            with pytest.raises(SchemaError, match="not a version number") as caught:
                await step()
            assert "\n" not in str(caught.value)
    finally:
        await store.close()


@pytest.mark.parametrize("text", ["9" * 5000, "99999999999999999999999", "²", "0"])
async def test_ids_past_any_integer_column_name_nothing(make_app, clock, text) -> None:
    """Digit strings too long for an id (past Python's digit limit too) or not ASCII name
    no delivery and no token on every backend, rather than raising."""
    app = await make_app()
    await enqueue(app)
    for by in ("auto", "id"):
        assert await app.store.get_delivery(text, by=by) is None
    assert await app.store.search_deliveries(text) == []
    assert await app.store.revoke_token(text, now=clock.now()) is None
