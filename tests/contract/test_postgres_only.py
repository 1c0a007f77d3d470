"""What only the PostgreSQL backend does: locks between processes, LISTEN/NOTIFY,
enqueue inside the application's transaction, and surviving a lost connection."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psycopg
import pytest

from differential import first_difference
from kirim.errors import StoreError
from kirim.model import AttemptStatus, DeliveryStatus
from kirim.store.base import (
    SCHEMA_VERSION,
    Claim,
)
from kirim.store.postgres import PostgresStore
from kirim.store.postgres.driver import Q, bind
from kirim.store.sqlite import SQLiteStore
from kirim.testing import ManualClock
from notify_kit import intent_of, numbered
from pg import fresh_database

StoreFactory = Callable[..., Awaitable[PostgresStore]]


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty PostgreSQL database (skipped, or failed in CI, without a server)."""
    return fresh_database(request)


@pytest.fixture
async def make_store(pg_url: str) -> AsyncIterator[StoreFactory]:
    """Open stores on the same database, each with its own pool (like a process)."""
    stores: list[PostgresStore] = []

    async def make(*, migrate: bool = True) -> PostgresStore:
        store = PostgresStore(pg_url)
        await store.open()
        stores.append(store)
        if migrate:
            await store.migrate()
        return store

    yield make
    for store in stores:
        await store.close()


async def begin_intent(conn: psycopg.AsyncConnection, c: Claim, request_id: str) -> bool:
    """Write an attempt intent in an open transaction (a worker between write and commit)."""
    cur = await conn.execute(
        Q["insert_intents"],
        bind(
            {
                "items": [
                    {
                        "delivery_id": c.delivery.id,
                        "job_id": c.job.id,
                        "token": c.token,
                        "number": c.job.attempts,
                        "request_id": request_id,
                        "worker_id": "w1",
                        "requested_at": c.job.updated_at,
                        "send_deadline": None,
                        "settles_at": None,
                        "provider": None,
                    }
                ]
            }
        ),
    )
    return len(await cur.fetchall()) == 1


async def test_concurrent_migrations_are_safe(make_store: StoreFactory) -> None:
    """Two processes running `kirim init` at once both end on the same schema version."""
    stores = [await make_store(migrate=False) for _ in range(4)]
    versions = await asyncio.gather(*(s.migrate() for s in stores))
    assert versions == [SCHEMA_VERSION] * 4
    for store in stores:
        await store.check_schema()


async def test_wait_for_jobs_wakes_on_enqueue(make_store: StoreFactory, clock: ManualClock) -> None:
    """A worker waiting on LISTEN wakes within a second of an enqueue on another host."""
    worker, producer = await make_store(), await make_store()
    assert await worker.wait_for_jobs(0.05) is True  # a new listener: poll once
    assert await worker.wait_for_jobs(0.05) is False  # nothing yet: times out
    waiting = asyncio.create_task(worker.wait_for_jobs(10.0))
    await asyncio.sleep(0.1)  # the listener is up
    started = time.monotonic()
    await producer.enqueue([numbered(1)], now=clock.now())
    assert await asyncio.wait_for(waiting, 1.0) is True
    assert time.monotonic() - started < 1.0
    assert await worker.wait_for_jobs(0.05) is False  # woken once, not again


async def test_notification_between_waits_is_not_lost(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    """A job enqueued while the worker was busy wakes its next wait at once."""
    worker, producer = await make_store(), await make_store()
    assert await worker.wait_for_jobs(0.01) is True  # a new listener: poll once
    assert await worker.wait_for_jobs(0.01) is False
    await producer.enqueue([numbered(1)], now=clock.now())
    await asyncio.sleep(0.1)
    assert await asyncio.wait_for(worker.wait_for_jobs(10.0), 1.0) is True


async def test_cancelled_wait_leaves_the_listener_usable(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    """A wait cancelled by its caller (a worker told to stop) does not break the next one."""
    worker, producer = await make_store(), await make_store()
    assert await worker.wait_for_jobs(0.01) is True  # a new listener: poll once
    waiting = asyncio.create_task(worker.wait_for_jobs(10.0))
    await asyncio.sleep(0.1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await producer.enqueue([numbered(1)], now=clock.now())
    assert await asyncio.wait_for(worker.wait_for_jobs(10.0), 1.0) is True


async def test_enqueue_in_follows_the_callers_transaction(
    make_store: StoreFactory, pg_url: str, clock: ManualClock
) -> None:
    """enqueue_in commits with the application's transaction and vanishes on rollback."""
    store = await make_store()
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        await conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        await conn.commit()

        await conn.execute("INSERT INTO orders VALUES (1)")
        [kept] = await store.enqueue_in(conn, [numbered(1)], now=clock.now())
        assert kept.created
        assert await store.get_delivery("key-1") is None  # not committed yet
        await conn.commit()

        await conn.execute("INSERT INTO orders VALUES (2)")
        [gone] = await store.enqueue_in(conn, [numbered(2)], now=clock.now())
        assert gone.created
        await conn.rollback()

    delivery = await store.get_delivery("key-1")
    assert delivery is not None
    assert delivery.id == kept.delivery.id
    assert delivery.status is DeliveryStatus.PENDING
    assert await store.get_delivery("key-2") is None
    assert await store.counts() == {"deliveries": {"pending": 1}, "jobs": {"queued": 1}}


async def test_enqueue_in_wakes_workers_only_on_commit(
    make_store: StoreFactory, pg_url: str, clock: ManualClock
) -> None:
    """The wake-up of a transactional enqueue is sent when the caller commits."""
    worker, store = await make_store(), await make_store()
    assert await worker.wait_for_jobs(0.01) is True  # a new listener: poll once
    assert await worker.wait_for_jobs(0.01) is False
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        await store.enqueue_in(conn, [numbered(1)], now=clock.now())
        assert await worker.wait_for_jobs(0.2) is False
        await conn.commit()
    assert await worker.wait_for_jobs(1.0) is True


async def test_terminated_connection_is_survived(
    make_store: StoreFactory, pg_url: str, clock: ManualClock
) -> None:
    """After pg_terminate_backend the call in progress fails with StoreError; the next works."""
    store = await make_store()
    assert await store.wait_for_jobs(0.01) is True  # a new listener: poll once
    assert await store.wait_for_jobs(0.01) is False  # the listener connection is up too
    await store.enqueue([numbered(1)], now=clock.now())
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
        cur = await admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        row = await cur.fetchone()
        assert row is not None
        assert row[0] >= 2
    with pytest.raises(StoreError):
        await store.in_flight()
    assert await store.in_flight() == 0
    claims = await store.claim(worker_id="w", now=clock.now(), lease=10, limit=5)
    assert [c.delivery.idempotency_key for c in claims] == ["key-1"]
    # The listener was lost too: the waits say "poll now" until it listens again.
    assert await store.wait_for_jobs(0.01) is True
    assert [await store.wait_for_jobs(0.01) for _ in range(3)][-1] is False
    await store.enqueue([numbered(2)], now=clock.now())
    assert await store.wait_for_jobs(1.0) is True


async def test_concurrent_claims_never_share_a_job(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    """Workers on separate connections claiming at once lease every due job exactly once."""
    stores = [await make_store() for _ in range(4)]
    await stores[0].enqueue([numbered(n) for n in range(60)], now=clock.now())

    async def claim_all(store: PostgresStore, worker: str) -> list[int]:
        got: list[int] = []
        while True:
            claims = await store.claim(worker_id=worker, now=clock.now(), lease=30, limit=7)
            if not claims:
                return got
            got += [c.job.id for c in claims]

    results = await asyncio.gather(*(claim_all(s, f"w{i}") for i, s in enumerate(stores)))
    every = [job for got in results for job in got]
    assert len(every) == len(set(every)) == 60
    assert await stores[0].counts() == {"deliveries": {"processing": 60}, "jobs": {"running": 60}}


async def test_reaper_waits_for_an_intent_in_flight(
    make_store: StoreFactory, pg_url: str, clock: ManualClock
) -> None:
    """An intent written just before the lease expired is seen by the next claimer."""
    store, reaper = await make_store(), await make_store()
    await store.enqueue([numbered(1)], now=clock.now())
    [first] = await store.claim(worker_id="w1", now=clock.now(), lease=10, limit=1)
    clock.advance(11)
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        assert await begin_intent(conn, first, "req-slow")
        reaping = asyncio.create_task(reaper.reap(now=clock.now()))
        await asyncio.sleep(0.2)
        assert not reaping.done()  # the claim revocation waits for the intent's commit
        await conn.commit()
    [reaped] = await reaping
    assert not reaped.dead
    [second] = await store.claim(worker_id="w2", now=clock.now(), lease=10, limit=1)
    assert second.token != first.token
    assert [a.provider_request_id for a in second.doubtful] == ["req-slow"]


async def test_reaper_parks_in_doubt_after_an_intent_in_flight(
    make_store: StoreFactory, pg_url: str, clock: ManualClock
) -> None:
    """On the final attempt, an intent committed while the reaper waited makes it in doubt."""
    store, reaper = await make_store(), await make_store()
    await store.enqueue([numbered(1, max_attempts=1)], now=clock.now())
    [first] = await store.claim(worker_id="w1", now=clock.now(), lease=10, limit=1)
    clock.advance(11)
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        assert await begin_intent(conn, first, "req-slow")
        reaping = asyncio.create_task(reaper.reap(now=clock.now()))
        await asyncio.sleep(0.2)
        assert not reaping.done()
        await conn.commit()
    [reaped] = await reaping
    assert reaped.dead
    delivery = await store.get_delivery("key-1")
    assert delivery is not None
    assert delivery.status is DeliveryStatus.IN_DOUBT
    [attempt] = (await store.attempts_of_many([delivery.id]))[delivery.id]
    assert attempt.status is AttemptStatus.REQUESTED


async def test_intent_after_a_revocation_is_refused(
    make_store: StoreFactory, pg_url: str, clock: ManualClock
) -> None:
    """An intent that waited for a reaper's revocation is refused: nothing may be sent."""
    store = await make_store()
    await store.enqueue([numbered(1)], now=clock.now())
    [first] = await store.claim(worker_id="w1", now=clock.now(), lease=10, limit=1)
    clock.advance(11)
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        await conn.execute(
            "UPDATE kirim_deliveries SET updated_at = updated_at WHERE id = %s",
            (first.delivery.id,),
        )  # another transaction holds the delivery row, as a reaper would
        writing = asyncio.create_task(store.record_intents([intent_of(first, "req-late")]))
        await asyncio.sleep(0.2)
        assert not writing.done()
        await conn.execute(
            "UPDATE kirim_deliveries SET claim_token = NULL WHERE id = %s", (first.delivery.id,)
        )
        await conn.commit()
    assert await writing == [False]
    assert (await store.attempts_of_many([first.delivery.id]))[first.delivery.id] == []


async def test_concurrent_enqueues_create_each_key_once(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    """Hosts enqueueing the same keys at once create each delivery exactly once."""
    stores = [await make_store() for _ in range(4)]
    batches = [[numbered(n) for n in range(i, 40, 1 + i % 2)] for i in range(4)]
    results = await asyncio.gather(
        *(s.enqueue(b, now=clock.now()) for s, b in zip(stores, batches, strict=True))
    )
    created = [r.delivery.idempotency_key for rs in results for r in rs if r.created]
    assert sorted(created) == sorted({it.idempotency_key for b in batches for it in b})
    ids = {r.delivery.idempotency_key: r.delivery.id for rs in results for r in rs}
    for rs in results:
        for r in rs:
            assert r.delivery.id == ids[r.delivery.idempotency_key]
            assert r.job is not None
    assert (await stores[0].counts())["jobs"] == {"queued": 40}


# -- the same answers as the reference backend ----------------------------------------


@pytest.mark.parametrize("seed", range(4))
async def test_same_answers_as_sqlite(pg_url: str, tmp_path: Path, seed: int) -> None:
    """Random call sequences give the same results and rows as the SQLite reference."""
    assert await first_difference(_pair(tmp_path / "ref.db", pg_url), seed) is None


async def test_mutation_unfenced_finish_is_caught(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's one-statement finish with its token fence taken out (it writes a
    finish whose claim was lost) differs from SQLite's careful finish within 200 seeds."""
    from pg import fresh_database

    unfenced = Q["finish_fenced"]
    for fence in ("j.lease_token = u.token", "d.claim_token = u.token"):
        assert fence in unfenced
        unfenced = unfenced.replace(fence, "true")
    monkeypatch.setitem(Q, "finish_fenced", unfenced)
    for seed in range(200):
        pair = _pair(tmp_path / f"{seed}.db", fresh_database(request))
        where = await first_difference(pair, seed)
        if where is not None:
            assert "finish" in where, where
            return
    pytest.fail("a finish without its token fence was not caught within 200 seeds")


def _pair(reference: Path, pg_url: str) -> tuple[SQLiteStore, PostgresStore]:
    """The careful way on SQLite, and PostgreSQL."""
    careful = SQLiteStore(f"sqlite:///{reference}")
    careful.careful_only = True
    return careful, PostgresStore(pg_url)
