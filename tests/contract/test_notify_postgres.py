"""The notification layer's races on PostgreSQL, each interleaving forced: a second
transaction is started while the first holds its rows, is seen waiting for a lock
(``pg_stat_activity``), and only then is the first committed (or rolled back)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg.rows import dict_row
from test_digests import START, STREAM, WINDOW, event, listing
from test_notify_intake import throttled

from kirim.model import DeliveryStatus
from kirim.store.base import Throttle
from kirim.store.digests import digest_key, seal
from kirim.store.postgres import PostgresStore
from kirim.store.postgres.driver import drive
from kirim.testing import ManualClock
from pg import fresh_database

T = TypeVar("T")


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> str:
    return fresh_database(request)


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(pg_url)
    await s.open()
    await s.migrate()
    yield s
    await s.close()


async def waiting(pg_url: str, task: Awaitable[T]) -> asyncio.Task[T]:
    """Start ``task`` and return once its transaction waits for a lock (it must)."""
    started = asyncio.ensure_future(task)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
        for _ in range(2000):
            cur = await admin.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            row = await cur.fetchone()
            if row is not None and row[0] > 0:
                return started
            assert not started.done(), "it did not wait for the lock"
            await asyncio.sleep(0.005)  # polls for the state; orders nothing
    raise AssertionError("the second transaction never waited for the first")


async def rows(pg_url: str, sql: str) -> list[Any]:
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute(sql)
        return await cur.fetchall()


@pytest.mark.parametrize("first_commits", [True, False], ids=["commit", "rollback"])
async def test_throttle_waits_for_the_slot_of_another_transaction(
    store: PostgresStore, pg_url: str, clock: ManualClock, first_commits: bool
) -> None:
    """A second enqueue waits for the first's counter row: the last slot goes to one of
    them, and back to the second when the first rolls back."""
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        [mine] = await store.enqueue_in(conn, [throttled("k1", limit=1)], now=clock.now())
        assert mine.delivery.status is DeliveryStatus.PENDING
        second = await waiting(pg_url, store.enqueue([throttled("k2", limit=1)], now=clock.now()))
        await (conn.commit() if first_commits else conn.rollback())
    [theirs] = await second
    if first_commits:
        assert (theirs.delivery.status, theirs.delivery.reason) == (
            DeliveryStatus.SUPPRESSED,
            "throttled",
        )
    else:
        assert theirs.delivery.status is DeliveryStatus.PENDING
    assert await rows(pg_url, "SELECT count FROM kirim_throttle") == [(1,)]


async def test_an_event_before_the_seal_is_in_it(
    store: PostgresStore, pg_url: str, clock: ManualClock
) -> None:
    """The seal waits for an event being added to its digest, then includes it."""
    await store.enqueue([event("e1")], now=clock.now())
    clock.advance(WINDOW)
    [c] = await store.claim(worker_id="w", now=clock.now(), lease=30, limit=1)
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        [late] = await store.enqueue_in(conn, [event("e2")], now=START + 10)
        assert late.delivery.id == c.delivery.id
        sealing = await waiting(
            pg_url, store.seal_digest(c.delivery.id, c.token, now=clock.now(), compose=listing)
        )
        await conn.commit()
    sealed = await sealing
    assert sealed is not None
    assert [e[0] for e in sealed.payload["events"]] == ["e1", "e2"]


async def test_an_event_after_the_seal_waits_and_goes_to_the_next(
    store: PostgresStore, pg_url: str, clock: ManualClock
) -> None:
    """An event that comes while the seal holds its digest waits for it, finds it
    sealed, and goes to the next window's digest: in exactly one."""
    await store.enqueue([event("e1")], now=clock.now())
    clock.advance(WINDOW)
    [c] = await store.claim(worker_id="w", now=clock.now(), lease=30, limit=1)
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        async with conn.cursor(row_factory=dict_row) as cur:
            sealed = await drive(seal(c.delivery.id, c.token, clock.now(), listing), cur, None)
        adding = await waiting(pg_url, store.enqueue([event("e2")], now=START + 10))
        await conn.commit()
    [late] = await adding
    assert sealed is not None
    assert [e[0] for e in sealed.payload["events"]] == ["e1"]
    assert late.delivery.idempotency_key == digest_key(STREAM, START + WINDOW)
    assert await rows(
        pg_url, "SELECT event_id, digest_key FROM kirim_digest_events ORDER BY id"
    ) == [
        ("e1", digest_key(STREAM, START)),
        ("e2", digest_key(STREAM, START + WINDOW)),
    ]


@pytest.mark.parametrize("same_event", [False, True], ids=["two_events", "one_event_twice"])
async def test_first_events_of_two_hosts_make_one_digest(
    store: PostgresStore, pg_url: str, clock: ManualClock, same_event: bool
) -> None:
    """Two transactions with a first event of one window: one digest delivery; the same
    event from both is kept once."""
    other = PostgresStore(pg_url)
    await other.open()
    try:
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            [a] = await store.enqueue_in(conn, [event("e1")], now=clock.now())
            second = "e1" if same_event else "e2"
            racing = await waiting(pg_url, other.enqueue([event(second)], now=clock.now()))
            await conn.commit()
        [b] = await racing
    finally:
        await other.close()
    assert a.delivery.id == b.delivery.id
    assert (a.created, b.created) == (True, not same_event)
    assert await rows(pg_url, "SELECT count(*) FROM kirim_deliveries") == [(1,)]
    count = 1 if same_event else 2
    assert await rows(pg_url, "SELECT count(*) FROM kirim_digest_events") == [(count,)]


async def test_throttle_of_a_digest_in_another_transaction(
    store: PostgresStore, pg_url: str, clock: ManualClock
) -> None:
    """Two streams of one throttle scope, made by two transactions: one slot each
    taken in turn; the second over the limit is suppressed."""
    rule = Throttle(scope="recipient:u1:email", limit=1, window=3600.0)
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        [a] = await store.enqueue_in(conn, [event("e1", throttle=rule)], now=clock.now())
        racing = await waiting(
            pg_url,
            store.enqueue(
                [event("e2", stream="liked|u1|email|t2", throttle=rule)], now=clock.now()
            ),
        )
        await conn.commit()
    [b] = await racing
    assert a.delivery.status is DeliveryStatus.PENDING
    assert (b.delivery.status, b.delivery.reason) == (DeliveryStatus.SUPPRESSED, "throttled")
