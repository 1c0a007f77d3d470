"""The intake of the notification layer on every backend: a delivery's type and
recipient id, and deliveries recorded suppressed at once."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kirim.keys import canonical_json, payload_hash
from kirim.model import DeliveryStatus, JobStatus
from kirim.store import Store, open_store
from kirim.store.base import NewDelivery, Throttle
from kirim.testing import ManualClock


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.open()
    await s.migrate()
    yield s
    await s.close()


def item(key: str, **kw: object) -> NewDelivery:
    text = canonical_json({"key": key})
    fields: dict[str, object] = {
        "idempotency_key": key,
        "event_id": f"e-{key}",
        "recipient": f"{key}@example.com",
        "channel": "email",
        "payload_json": text,
        "payload_hash": payload_hash(text),
        "run_at": None,
        "max_attempts": 3,
        **kw,
    }
    return NewDelivery(**fields)  # type: ignore[arg-type]


async def test_type_and_recipient_id_are_recorded(store: Store, clock: ManualClock) -> None:
    """A delivery keeps its notification type and recipient id, as enqueued and as read."""
    [r] = await store.enqueue(
        [item("k1", type="order_shipped", recipient_id="u1")], now=clock.now()
    )
    assert (r.delivery.type, r.delivery.recipient_id, r.delivery.reason) == (
        "order_shipped",
        "u1",
        None,
    )
    read = await store.get_delivery("k1")
    assert read is not None
    assert (read.type, read.recipient_id, read.status) == (
        "order_shipped",
        "u1",
        DeliveryStatus.PENDING,
    )


async def test_a_suppressed_delivery_is_final_and_never_claimed(
    store: Store, clock: ManualClock
) -> None:
    """A suppressed item is recorded suppressed with its reason, its job completed, and
    no worker claims it."""
    [r] = await store.enqueue(
        [item("k1", type="t", recipient_id="u1", suppressed="opted_out")], now=clock.now()
    )
    assert r.created
    assert (r.delivery.status, r.delivery.reason) == (DeliveryStatus.SUPPRESSED, "opted_out")
    assert r.job is not None
    assert r.job.status is JobStatus.COMPLETED
    job = await store.get_job(r.delivery.id)
    assert job is not None
    assert job.status is JobStatus.COMPLETED
    assert job.last_error == "suppressed (opted_out)"
    assert await store.claim(worker_id="w", now=clock.now() + 60, lease=10, limit=10) == []
    assert await store.counts() == {"deliveries": {"suppressed": 1}, "jobs": {"completed": 1}}


async def test_a_mixed_batch_keeps_its_order_and_its_keys(store: Store, clock: ManualClock) -> None:
    """Plain and suppressed items in one batch: one result each, in order; a key given
    again returns the delivery recorded first."""
    first = await store.enqueue(
        [item("a"), item("b", suppressed="channel_opted_out"), item("c", recipient_id="u3")],
        now=clock.now(),
    )
    assert [r.delivery.idempotency_key for r in first] == ["a", "b", "c"]
    assert [r.delivery.status for r in first] == [
        DeliveryStatus.PENDING,
        DeliveryStatus.SUPPRESSED,
        DeliveryStatus.PENDING,
    ]
    again = await store.enqueue([item("b"), item("a", suppressed="opted_out")], now=clock.now())
    assert [r.created for r in again] == [False, False]
    assert [r.delivery.status for r in again] == [DeliveryStatus.SUPPRESSED, DeliveryStatus.PENDING]
    assert again[0].delivery.reason == "channel_opted_out"
    claims = await store.claim(worker_id="w", now=clock.now(), lease=10, limit=10)
    assert sorted(c.delivery.idempotency_key for c in claims) == ["a", "c"]


# -- throttle -------------------------------------------------------------------------

HOUR = 3600.0
START = 1_800_000_000.0  # ManualClock's start: 500,000 whole hours after the epoch


def throttled(key: str, *, over: str = "suppress", limit: int = 3, **kw: object) -> NewDelivery:
    rule = Throttle(scope="recipient:u1:email", limit=limit, window=HOUR, over=over)  # type: ignore[arg-type]
    return item(key, type="t", recipient_id="u1", throttle=rule, **kw)


async def test_throttle_suppresses_over_the_limit_per_window(
    store: Store, clock: ManualClock
) -> None:
    """At most ``limit`` deliveries per window go out; the rest are suppressed
    ``throttled``; the next window has room again."""
    got = await store.enqueue([throttled(f"k{i}") for i in range(5)], now=clock.now())
    assert [r.delivery.status for r in got] == [DeliveryStatus.PENDING] * 3 + [
        DeliveryStatus.SUPPRESSED
    ] * 2
    assert [r.delivery.reason for r in got[3:]] == ["throttled", "throttled"]
    assert all(r.job is not None and r.job.status is JobStatus.COMPLETED for r in got[3:])
    read = await store.get_delivery("k4")
    assert read is not None
    assert (read.status, read.reason) == (
        DeliveryStatus.SUPPRESSED,
        "throttled",
    )
    clock.advance(HOUR)
    [later] = await store.enqueue([throttled("k5")], now=clock.now())
    assert later.delivery.status is DeliveryStatus.PENDING
    assert await store.counts() == {
        "deliveries": {"pending": 4, "suppressed": 2},
        "jobs": {"queued": 4, "completed": 2},
    }


async def test_throttle_defers_to_the_first_later_window_with_room(
    store: Store, clock: ManualClock
) -> None:
    """``defer`` moves a delivery over the limit to the next window with room, counted
    there, so the windows after fill in turn."""
    got = await store.enqueue(
        [throttled(f"k{i}", over="defer", limit=2) for i in range(5)], now=clock.now()
    )
    assert all(r.delivery.status is DeliveryStatus.PENDING for r in got)
    runs = [r.job.run_at for r in got if r.job is not None]
    assert runs == [START, START, START + HOUR, START + HOUR, START + 2 * HOUR]
    job = await store.get_job(got[4].delivery.id)
    assert job is not None
    assert job.run_at == START + 2 * HOUR
    claims = await store.claim(worker_id="w", now=clock.now(), lease=10, limit=10)
    assert sorted(c.delivery.idempotency_key for c in claims) == ["k0", "k1"]


async def test_throttle_counts_in_the_window_the_delivery_is_due(
    store: Store, clock: ManualClock
) -> None:
    """A delivery due later (a send window) takes a slot of the window it is due in."""
    due = START + 5 * HOUR + 60
    got = await store.enqueue(
        [throttled(f"k{i}", limit=1, run_at=due) for i in range(2)] + [throttled("now", limit=1)],
        now=clock.now(),
    )
    assert [r.delivery.status for r in got] == [
        DeliveryStatus.PENDING,
        DeliveryStatus.SUPPRESSED,
        DeliveryStatus.PENDING,
    ]


async def test_throttle_counts_each_delivery_once(store: Store, clock: ManualClock) -> None:
    """A key enqueued again takes no slot, nor does a delivery the preferences
    suppressed."""
    await store.enqueue([throttled("k0", limit=2)], now=clock.now())
    again = await store.enqueue(
        [throttled("k0", limit=2), throttled("k0", limit=2)], now=clock.now()
    )
    assert [r.created for r in again] == [False, False]
    [quiet] = await store.enqueue(
        [throttled("k1", limit=2, suppressed="opted_out")], now=clock.now()
    )
    assert quiet.delivery.reason == "opted_out"
    [second] = await store.enqueue([throttled("k2", limit=2)], now=clock.now())
    [third] = await store.enqueue([throttled("k3", limit=2)], now=clock.now())
    assert second.delivery.status is DeliveryStatus.PENDING
    assert (third.delivery.status, third.delivery.reason) == (
        DeliveryStatus.SUPPRESSED,
        "throttled",
    )


async def test_what_enqueue_returns_is_what_it_wrote(store: Store, clock: ManualClock) -> None:
    """The delivery and job of a new row, as enqueue answers them (SQLite builds them
    from what was given instead of reading them back), are the rows as stored: plain,
    typed, suppressed, due later, and with the payload given as a value or not."""
    now = clock.now()
    items = [
        item("plain"),
        item("typed", type="order_shipped", recipient_id="u1"),
        item("quiet", type="order_shipped", recipient_id="u2", suppressed="opted_out"),
        item("later", run_at=now + 90.5),
        item("value", payload={"key": "value"}),
    ]
    results = await store.enqueue(items, now=now)
    assert all(r.created for r in results)
    for r in results:
        stored = await store.get_delivery(str(r.delivery.id), by="id")
        assert r.delivery == stored
        assert r.job == await store.get_job(r.delivery.id)


async def test_throttle_defer_skips_a_long_run_of_full_windows(
    store: Store, clock: ManualClock
) -> None:
    """Past more full windows than one read returns (``throttle.PAGE``), ``defer`` still
    finds the first with room: a hole inside the run, then the run's end."""
    from kirim.store.throttle import PAGE

    n, hole = PAGE + 40, PAGE + 10
    due = [throttled(f"due{j}", limit=1, run_at=START + j * HOUR) for j in range(n) if j != hole]
    got = await store.enqueue(due, now=clock.now())
    assert all(r.delivery.status is DeliveryStatus.PENDING for r in got)
    deferred = await store.enqueue(
        [throttled(f"k{i}", over="defer", limit=1) for i in range(2)], now=clock.now()
    )
    runs = [r.job.run_at for r in deferred if r.job is not None]
    assert runs == [START + hole * HOUR, START + n * HOUR]
