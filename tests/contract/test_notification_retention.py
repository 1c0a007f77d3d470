"""Retention of the notification layer on both backends: prune deletes the throttle
counters of closed windows and the digests of pruned deliveries, and keeps each pruned
digest's event ids as long as its key tombstone, so a retried event never makes a
second digest."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from kirim.model import AttemptStatus, DeliveryStatus
from kirim.store import Store, open_store
from kirim.store.base import AttemptOutcome, Finish, Intent, Throttle
from kirim.store.digests import digest_key
from kirim.store.retention import WINDOW_GRACE, PruneResult
from kirim.store.throttle import window_start
from kirim.testing import ManualClock
from notify_kit import STREAM, WINDOW, event
from notify_kit import typed as item

HOUR = 3600.0
DAY = 86_400.0
KEEP = 30 * DAY
KEYS = 365 * DAY
START = 1_800_000_000.0  # ManualClock's start, a window boundary


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.open()
    await s.migrate()
    yield s
    await s.close()


# -- helpers -----------------------------------------------------------------------------


def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Read the database behind the store's back."""
    if url.startswith("sqlite:"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            return db.execute(sql).fetchall()
    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


def count(url: str, table: str) -> int:
    return int(rows(url, f"SELECT count(*) FROM {table}")[0][0])


def listing(delivery: Any, events: list[dict[str, Any]]) -> dict[str, Any]:
    return {"events": [e["event_id"] for e in events]}


async def deliver(store: Store, now: float) -> int:
    """Claim the one due delivery, seal it (a digest's), send it: its id."""
    [c] = await store.claim(worker_id="w", now=now, lease=30, limit=1)
    await store.seal_digest(c.delivery.id, c.token, now=now, compose=listing)
    request_id = f"req-{c.delivery.id}"
    intent = Intent(
        delivery_id=c.delivery.id,
        job_id=c.job.id,
        token=c.token,
        number=c.job.attempts,
        provider_request_id=request_id,
        worker_id="w",
        requested_at=now,
        send_deadline=now + 10,
        settles_at=now + 10,
    )
    assert await store.record_intents([intent]) == [True]
    outcome = AttemptOutcome(
        provider_request_id=request_id,
        status=AttemptStatus.SUCCEEDED,
        provider_message_id="p-1",
        error=None,
        completed_at=now,
    )
    finish = Finish(
        delivery_id=c.delivery.id,
        job_id=c.job.id,
        token=c.token,
        now=now,
        attempt=outcome,
        delivery_status=DeliveryStatus.SENT,
        provider_message_id="p-1",
    )
    [done] = await store.finish([finish])
    assert done.committed
    return c.delivery.id


async def newest(store: Store, now: float) -> None:
    """A newer plain delivery, sent: the rows holding the newest ids always stay."""
    await store.enqueue([item(f"newest-{now}")], now=now)
    await deliver(store, now)


async def digest_sent(store: Store, clock: ManualClock, *ids: str) -> int:
    """The events ``ids`` gathered into one digest at ``START``, sent when its window
    ends, then a newer delivery; the clock ends ``KEEP`` later. The digest's id."""
    got = await store.enqueue([event(i, n=n) for n, i in enumerate(ids)], now=clock.now())
    assert len({r.delivery.id for r in got}) == 1
    clock.advance(WINDOW)
    sent = await deliver(store, clock.now())
    assert sent == got[0].delivery.id
    await newest(store, clock.now())
    clock.advance(KEEP + 1)
    return sent


async def prune(
    store: Store, clock: ManualClock, *, limit: int = 500, dry_run: bool = False, **kw: float
) -> PruneResult:
    args = {"keep": KEEP, "keys": KEYS, **kw}
    return await store.prune(now=clock.now(), limit=limit, dry_run=dry_run, **args)  # type: ignore[attr-defined, no-any-return]


# -- throttle counters -------------------------------------------------------------------


async def test_counters_of_closed_windows_go_and_the_current_one_stays_exact(
    store: Store, clock: ManualClock, database_url: str
) -> None:
    """A counter whose window ended more than WINDOW_GRACE ago is pruned (counted by a
    dry run first); one that ended just now stays, and so does the current window's,
    begun long ago: its limit still holds after the prune."""
    daily = Throttle(scope="recipient:u1:email", limit=1, window=DAY)
    [old] = await store.enqueue([item("old", throttle=daily)], now=clock.now())
    assert old.delivery.status is DeliveryStatus.PENDING
    clock.advance(DAY + WINDOW_GRACE + 1)  # the first window closed; the next one began
    recent = Throttle(scope="recipient:u2:email", limit=1, window=WINDOW)
    await store.enqueue([item("recent", throttle=recent)], now=clock.now() - WINDOW_GRACE / 2)
    [now] = await store.enqueue([item("now", throttle=daily)], now=clock.now())
    assert now.delivery.status is DeliveryStatus.PENDING
    assert count(database_url, "kirim_throttle") == 3

    dry = await prune(store, clock, dry_run=True)
    assert (dry.throttle_expired, dry.deliveries) == (1, 0)
    assert count(database_url, "kirim_throttle") == 3
    done = await prune(store, clock)
    assert (done.throttle_expired, done.more) == (1, False)
    assert sorted(rows(database_url, "SELECT scope, window_start, count FROM kirim_throttle")) == [
        ("recipient:u1:email", window_start(clock.now(), DAY), 1),
        ("recipient:u2:email", window_start(clock.now() - WINDOW_GRACE / 2, WINDOW), 1),
    ]
    [over] = await store.enqueue([item("over", throttle=daily)], now=clock.now())
    assert (over.delivery.status, over.delivery.reason) == (DeliveryStatus.SUPPRESSED, "throttled")
    assert (await prune(store, clock)).throttle_expired == 0


async def test_a_deferred_delivery_counts_into_a_later_window_kept_as_long(
    store: Store, clock: ManualClock, database_url: str
) -> None:
    """``defer`` takes a slot in the next window with room: that counter keeps its own
    window's end, so prune keeps it until that window is closed."""
    rule = Throttle(scope="recipient:u1:email", limit=1, window=HOUR, over="defer")
    await store.enqueue([item("a", throttle=rule), item("b", throttle=rule)], now=clock.now())
    ends = "SELECT window_start, window_end FROM kirim_throttle ORDER BY window_start"
    assert rows(database_url, ends) == [(START, START + HOUR), (START + HOUR, START + 2 * HOUR)]
    clock.advance(HOUR + WINDOW_GRACE + 1)
    assert (await prune(store, clock)).throttle_expired == 1
    assert rows(database_url, ends) == [(START + HOUR, START + 2 * HOUR)]


# -- digests -----------------------------------------------------------------------------


async def test_a_pruned_digest_keeps_its_events_ids_not_their_data(
    store: Store, clock: ManualClock, database_url: str
) -> None:
    """The digest goes with its delivery (a dry run counts both), its events' data
    too; each event's row stays, emptied, pruned when the tombstone was written."""
    sent = await digest_sent(store, clock, "e1", "e2")
    dry = await prune(store, clock, dry_run=True)
    assert (dry.deliveries, dry.digests, dry.digest_events) == (1, 1, 2)
    assert count(database_url, "kirim_digests") == 1
    assert rows(database_url, "SELECT data FROM kirim_digest_events ORDER BY id") == [
        ('{"n":0}',),
        ('{"n":1}',),
    ]
    done = await prune(store, clock)
    assert (done.deliveries, done.digests, done.digest_events, done.more) == (1, 1, 2, False)
    assert await store.get_delivery(str(sent), by="id") is None
    assert count(database_url, "kirim_digests") == 0
    kept = "SELECT event_id, digest_key, data, pruned_at FROM kirim_digest_events ORDER BY id"
    key = digest_key(STREAM, START)
    assert rows(database_url, kept) == [
        ("e1", key, "null", clock.now()),
        ("e2", key, "null", clock.now()),
    ]
    assert rows(database_url, "SELECT pruned_at FROM kirim_key_tombstones") == [(clock.now(),)]
    assert await prune(store, clock) == PruneResult()


async def test_an_event_retried_after_its_digest_was_pruned_makes_nothing(
    store: Store, clock: ManualClock, database_url: str
) -> None:
    """Within the keys horizon, a pruned digest's event given again is answered with the
    pruned delivery: no second digest, no new delivery; a new event still gets one."""
    sent = await digest_sent(store, clock, "e1", "e2")
    assert (await prune(store, clock)).digests == 1
    clock.advance(KEYS - DAY)
    assert await prune(store, clock) == PruneResult()
    before = await store.counts()
    [again] = await store.enqueue([event("e1", n=0)], now=clock.now())
    assert (again.created, again.pruned, again.job) == (False, True, None)
    assert (again.delivery.id, again.delivery.status) == (sent, DeliveryStatus.SENT)
    assert await store.counts() == before
    assert count(database_url, "kirim_digests") == 0
    [fresh] = await store.enqueue([event("e3")], now=clock.now())
    assert (fresh.created, fresh.pruned) == (True, False)
    assert fresh.delivery.id != sent


async def test_after_the_keys_horizon_a_pruned_digests_event_is_free(
    store: Store, clock: ManualClock, database_url: str
) -> None:
    """Once the tombstone is keys old, the events' rows go with it (a dry run counts
    them) and the event makes a new digest delivery."""
    sent = await digest_sent(store, clock, "e1", "e2")
    await prune(store, clock)
    clock.advance(KEYS + 1)
    dry = await prune(store, clock, dry_run=True)
    assert (dry.tombstones_expired, dry.digest_events_expired) == (1, 2)
    assert count(database_url, "kirim_digest_events") == 2
    done = await prune(store, clock)
    assert (done.tombstones_expired, done.digest_events_expired) == (1, 2)
    assert count(database_url, "kirim_digest_events") == 0
    [again] = await store.enqueue([event("e1")], now=clock.now())
    assert (again.created, again.pruned) == (True, False)
    assert again.delivery.id != sent
    assert again.delivery.status is DeliveryStatus.PENDING
    assert count(database_url, "kirim_digests") == 1


async def test_an_events_row_that_outlives_its_tombstone_is_forgotten(
    store: Store, clock: ManualClock, database_url: str
) -> None:
    """Batches bound the tombstones and the events' rows apart: an event whose row is
    still there when the tombstone has gone is new again (no error)."""
    sent = await digest_sent(store, clock, "e1", "e2")
    await prune(store, clock)
    clock.advance(KEYS + 1)
    done = await prune(store, clock, limit=1)
    assert (done.tombstones_expired, done.digest_events_expired, done.more) == (1, 1, True)
    [left] = rows(database_url, "SELECT event_id FROM kirim_digest_events")
    [again] = await store.enqueue([event(left[0])], now=clock.now())
    assert (again.created, again.pruned) == (True, False)
    assert again.delivery.id != sent
    assert rows(database_url, "SELECT event_id, pruned_at FROM kirim_digest_events") == [
        (left[0], None)
    ]


async def test_a_large_digest_goes_in_bounded_steps(
    store: Store, clock: ManualClock, database_url: str
) -> None:
    """limit=2 on a digest of 5 events: its events' data goes 2 at a time, the digest
    when the last is emptied; an event retried meanwhile is still answered pruned."""
    sent = await digest_sent(store, clock, *(f"e{i}" for i in range(5)))
    first = await prune(store, clock, limit=2)
    assert (first.deliveries, first.digest_events, first.digests, first.more) == (1, 2, 0, True)
    [again] = await store.enqueue([event("e4")], now=clock.now())
    assert (again.pruned, again.delivery.id) == (True, sent)
    steps = [await prune(store, clock, limit=2) for _ in range(2)]
    assert [(s.digest_events, s.digests, s.more) for s in steps] == [(2, 0, True), (1, 1, False)]
    assert rows(database_url, "SELECT DISTINCT data FROM kirim_digest_events") == [("null",)]
    assert count(database_url, "kirim_digests") == 0
    assert count(database_url, "kirim_deliveries") == 1  # the newest


async def test_a_digest_made_again_for_a_pruned_one_is_pruned_too(
    store: Store, clock: ManualClock, database_url: str
) -> None:
    """A new event stamped in a pruned digest's window (a host whose clock is far
    behind) makes the digest's row again: it is answered pruned, and the next prune
    takes that row and empties the event (kept for its dedup)."""
    sent = await digest_sent(store, clock, "e1")
    await prune(store, clock)
    [late] = await store.enqueue([event("e9", n=9)], now=START + 1)
    assert (late.pruned, late.delivery.id, late.job) == (True, sent, None)
    assert count(database_url, "kirim_deliveries") == 1  # the newest
    done = await prune(store, clock)
    assert (done.deliveries, done.digests, done.digest_events) == (0, 1, 1)
    assert count(database_url, "kirim_digests") == 0
    assert rows(database_url, "SELECT event_id, data FROM kirim_digest_events ORDER BY id") == [
        ("e1", "null"),
        ("e9", "null"),
    ]
    [again] = await store.enqueue([event("e9")], now=clock.now())
    assert (again.pruned, again.delivery.id) == (True, sent)


async def test_a_digest_whose_window_is_open_stays(
    store: Store, clock: ManualClock, database_url: str
) -> None:
    """A digest's finished delivery (canceled here) stays while its window may still
    take events, then goes once the window is closed."""
    [d] = await store.enqueue([event("e1")], now=clock.now())
    assert await store.cancel(d.delivery.id, now=clock.now())
    await newest(store, clock.now())
    clock.advance(WINDOW / 2)
    assert (await prune(store, clock, keep=60, dry_run=True)).deliveries == 0
    assert (await prune(store, clock, keep=60)).deliveries == 0
    [more] = await store.enqueue([event("e2")], now=clock.now())  # still its window
    assert more.delivery.id == d.delivery.id
    clock.advance(WINDOW / 2 + WINDOW_GRACE + 1)
    done = await prune(store, clock, keep=60)
    assert (done.deliveries, done.digests, done.digest_events) == (1, 1, 2)
    assert count(database_url, "kirim_digests") == 0


async def test_postgres_prune_skips_a_digest_another_transaction_holds(
    store: Store, clock: ManualClock, database_url: str
) -> None:
    """PostgreSQL: a digest locked by another transaction (an enqueue, a seal) keeps
    its delivery for a later round, never waited for."""
    if not database_url.startswith("postgresql:"):
        pytest.skip("row locks: PostgreSQL only (SQLite serialises every writer)")
    sent = await digest_sent(store, clock, "e1")
    other = await psycopg.AsyncConnection.connect(database_url)
    async with other, other.transaction():
        await other.execute(
            "SELECT 1 FROM kirim_digests WHERE key = %s FOR NO KEY UPDATE",
            (digest_key(STREAM, START),),
        )
        done = await asyncio.wait_for(prune(store, clock), timeout=10)
        assert (done.deliveries, done.digests) == (0, 0)
        assert await store.get_delivery(str(sent), by="id") is not None
    done = await prune(store, clock)
    assert (done.deliveries, done.digests, done.digest_events) == (1, 1, 1)


# -- the result --------------------------------------------------------------------------


def test_the_result_keeps_its_keys_and_adds_the_layers() -> None:
    """as_dict keeps every key it had, in order, then the notification layer's, then
    the runs' and topics'; a round that only pruned a layer removed something; sums
    add every field."""
    keys = list(PruneResult().as_dict())
    assert keys[:7] == [
        "dry_run",
        "deliveries",
        "jobs",
        "attempts",
        "requests",
        "tombstones_written",
        "tombstones_expired",
    ]
    assert keys[7:] == [
        *("digests", "digest_events", "digest_events_expired", "throttle_expired"),
        "feed_items",
        *("runs", "run_steps", "topic_events", "subscriptions", "record_tombstones_expired"),
        "run_digests",
    ]
    for name in keys[7:]:
        one = PruneResult(**{name: 1})
        assert one.removed_anything, name
        assert (one + one).as_dict()[name] == 2
