"""Digests on every backend: the events of a window in one delivery, each event once,
sealed by the claim that sends it; an event after the seal goes to the next window."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kirim.keys import canonical_json, payload_hash
from kirim.model import Delivery, DeliveryStatus, JobStatus
from kirim.store import Store, open_store
from kirim.store.base import Throttle
from kirim.store.digests import digest_key
from kirim.testing import ManualClock
from notify_kit import STREAM, WINDOW, event

START = 1_800_000_000.0  # ManualClock's start, a window boundary


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.open()
    await s.migrate()
    yield s
    await s.close()


def listing(delivery: Delivery, events: list[dict[str, Any]]) -> dict[str, Any]:
    """A compose function: the events' ids and data, in order."""
    return {"count": len(events), "events": [[e["event_id"], e["data"]] for e in events]}


async def claim_one(store: Store, now: float) -> Any:
    [c] = await store.claim(worker_id="w", now=now, lease=30, limit=10)
    return c


async def test_events_of_a_window_make_one_delivery(store: Store, clock: ManualClock) -> None:
    """Every event of a window goes into one digest delivery, due when the window ends;
    its key derives from the stream and the window."""
    got = await store.enqueue([event("e1", n=1), event("e2", n=2)], now=clock.now())
    clock.advance(WINDOW - 1)
    got += await store.enqueue([event("e3", n=3)], now=clock.now())
    ids = {r.delivery.id for r in got}
    assert len(ids) == 1
    assert all(r.created for r in got)
    d = got[0].delivery
    assert d.idempotency_key == digest_key(STREAM, START)
    assert (d.type, d.recipient_id, d.channel, d.status) == (
        "liked",
        "u1",
        "email",
        DeliveryStatus.PENDING,
    )
    assert got[-1].job is not None
    assert got[-1].job.run_at == START + WINDOW
    assert await store.counts() == {"deliveries": {"pending": 1}, "jobs": {"queued": 1}}


async def test_an_event_given_twice_is_kept_once(store: Store, clock: ManualClock) -> None:
    """The same event id again (in the batch, or later, even in the next window) finds
    the digest that holds it and adds nothing."""
    first = await store.enqueue([event("e1"), event("e1")], now=clock.now())
    assert [r.created for r in first] == [True, False]
    clock.advance(WINDOW + 1)
    [again] = await store.enqueue([event("e1")], now=clock.now())
    assert not again.created
    assert again.delivery.id == first[0].delivery.id
    c = await claim_one(store, clock.now())
    sealed = await store.seal_digest(c.delivery.id, c.token, now=clock.now(), compose=listing)
    assert sealed is not None
    assert sealed.payload["count"] == 1


async def test_streams_and_windows_each_get_their_own(store: Store, clock: ManualClock) -> None:
    """Another stream, or the next window, is another digest delivery."""
    [a] = await store.enqueue([event("e1")], now=clock.now())
    [b] = await store.enqueue([event("e2", stream="liked|u2|email|u2")], now=clock.now())
    clock.advance(WINDOW)
    [c] = await store.enqueue([event("e3")], now=clock.now())
    assert len({a.delivery.id, b.delivery.id, c.delivery.id}) == 3
    assert c.delivery.idempotency_key == digest_key(STREAM, START + WINDOW)


async def test_the_seal_writes_the_events_once(store: Store, clock: ManualClock) -> None:
    """The claim's seal writes the payload composed of the events, oldest first; a later
    claim's seal returns it as recorded, without composing again."""
    await store.enqueue([event("e1", n=1), event("e2", n=2)], now=clock.now())
    clock.advance(WINDOW)
    c = await claim_one(store, clock.now())
    sealed = await store.seal_digest(c.delivery.id, c.token, now=clock.now(), compose=listing)
    assert sealed is not None
    want = {"count": 2, "events": [["e1", {"n": 1}], ["e2", {"n": 2}]]}
    assert sealed.payload == want
    assert sealed.payload_hash == payload_hash(canonical_json(want))
    read = await store.get_delivery(str(c.delivery.id), by="id")
    assert read is not None
    assert read.payload == want
    assert read.payload_hash == sealed.payload_hash

    def never(d: Delivery, events: list[dict[str, Any]]) -> Any:
        raise AssertionError("composed twice")

    again = await store.seal_digest(c.delivery.id, c.token, now=clock.now(), compose=never)
    assert again is not None
    assert again.payload == want


async def test_the_seal_is_fenced_by_the_claim_token(store: Store, clock: ManualClock) -> None:
    """A seal with a token that no longer holds writes nothing and says so."""
    await store.enqueue([event("e1")], now=clock.now())
    clock.advance(WINDOW)
    c = await claim_one(store, clock.now())
    assert await store.seal_digest(c.delivery.id, "stale", now=clock.now(), compose=listing) is None
    [more] = await store.enqueue([event("e2")], now=START + 1)  # still open: it goes in
    assert more.delivery.id == c.delivery.id
    sealed = await store.seal_digest(c.delivery.id, c.token, now=clock.now(), compose=listing)
    assert sealed is not None
    assert sealed.payload["count"] == 2


async def test_an_event_after_the_seal_goes_to_the_next_window(
    store: Store, clock: ManualClock
) -> None:
    """An event stamped inside a sealed digest's window (a host whose clock is behind)
    goes to the next window's digest: in one digest, never lost, never in two."""
    [first] = await store.enqueue([event("e1")], now=clock.now())
    clock.advance(WINDOW)
    c = await claim_one(store, clock.now())
    await store.seal_digest(c.delivery.id, c.token, now=clock.now(), compose=listing)
    [late] = await store.enqueue([event("e2")], now=START + 10)
    assert late.delivery.id != first.delivery.id
    assert late.delivery.idempotency_key == digest_key(STREAM, START + WINDOW)
    assert late.job is not None
    assert late.job.run_at == START + 2 * WINDOW
    clock.advance(WINDOW)
    c2 = await claim_one(store, clock.now())
    sealed = await store.seal_digest(c2.delivery.id, c2.token, now=clock.now(), compose=listing)
    assert sealed is not None
    assert sealed.payload["events"] == [["e2", {}]]


async def test_a_compose_error_writes_nothing(store: Store, clock: ManualClock) -> None:
    """What compose raises leaves the digest open and the payload as it was."""
    await store.enqueue([event("e1")], now=clock.now())
    clock.advance(WINDOW)
    c = await claim_one(store, clock.now())

    def broken(d: Delivery, events: list[dict[str, Any]]) -> Any:
        raise ValueError("template error")

    with pytest.raises(ValueError, match="template error"):
        await store.seal_digest(c.delivery.id, c.token, now=clock.now(), compose=broken)
    [more] = await store.enqueue([event("e2")], now=START + 1)
    assert more.delivery.id == c.delivery.id
    assert json.loads(canonical_json(more.delivery.payload))["events"] == []


async def test_a_digest_counts_once_in_its_throttle(store: Store, clock: ManualClock) -> None:
    """A throttled digest type: the digest delivery takes one slot, whatever its events;
    another stream over the limit is suppressed with all its events."""
    rule = Throttle(scope="recipient:u1:email", limit=1, window=3600.0)
    got = await store.enqueue([event(f"e{i}", throttle=rule) for i in range(5)], now=clock.now())
    assert {r.delivery.status for r in got} == {DeliveryStatus.PENDING}
    other = "liked|u1|email|thread-2"
    over = await store.enqueue(
        [event(f"o{i}", stream=other, throttle=rule) for i in range(2)], now=clock.now()
    )
    assert {r.delivery.status for r in over} == {DeliveryStatus.SUPPRESSED}
    assert {r.delivery.reason for r in over} == {"throttled"}
    job = await store.get_job(over[0].delivery.id)
    assert job is not None
    assert job.status is JobStatus.COMPLETED
