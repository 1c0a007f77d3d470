"""The worker's side of the notification layer on every backend: a digest sealed by
the claim that sends it (every event in it, each once), and a channel's provider
request rate kept by every worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from test_digests import START, WINDOW, event, listing
from test_notify_intake import item

from backends import POOLED, backend_url
from kirim.channels import Channel
from kirim.model import Delivery, DeliveryStatus, JobStatus, RecordFilter
from kirim.observe.metrics import Metrics
from kirim.store import Store, open_store
from kirim.testing import Checkpoints, FlakyProvider, ManualClock
from kirim.worker import Worker, WorkerSettings

SETTINGS = WorkerSettings(lease=30.0, backoff_base=1.0, backoff_max=1.0)


@pytest.fixture(params=POOLED)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database of each backend, and one reached through PgBouncer in
    transaction pooling mode: the worker's store calls keep nothing in a session."""
    return backend_url(request, tmp_path)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.open()
    await s.migrate()
    yield s
    await s.close()


def worker(
    store: Store,
    provider: FlakyProvider,
    clock: ManualClock,
    *,
    name: str = "A",
    compose: Any = listing,
    rate: float | None = None,
    checkpoints: Checkpoints | None = None,
    metrics: Metrics | None = None,
) -> Worker:
    channel = Channel(name="email", provider=provider, rate=rate)
    return Worker(
        store,
        {"email": channel},
        settings=SETTINGS,
        worker_id=name,
        clock=clock,
        checkpoints=checkpoints,
        digests={"liked": compose},
        metrics=metrics,
    )


async def test_a_digest_is_sent_once_with_its_events(store: Store, clock: ManualClock) -> None:
    """At the window's end one request leaves, its payload the window's events."""
    provider = FlakyProvider()
    await store.enqueue([event("e1", n=1), event("e2", n=2)], now=clock.now())
    w = worker(store, provider, clock)
    assert await w.run_once() == 0  # not due before the window ends
    clock.advance(WINDOW)
    assert await w.run_once() == 1
    [sent] = provider.requests
    assert sent.payload == {"count": 2, "events": [["e1", {"n": 1}], ["e2", {"n": 2}]]}
    d = await store.get_delivery(sent.idempotency_key)
    assert d is not None
    assert d.status is DeliveryStatus.SENT
    assert d.payload == sent.payload


async def test_a_retried_digest_sends_what_was_sealed(store: Store, clock: ManualClock) -> None:
    """A retry sends the payload recorded at the first seal, composed once."""
    provider = FlakyProvider(script=["transient"])
    calls: list[int] = []

    def counting(d: Delivery, events: list[dict[str, Any]]) -> Any:
        calls.append(len(events))
        return listing(d, events)

    await store.enqueue([event("e1")], now=clock.now())
    clock.advance(WINDOW)
    w = worker(store, provider, clock, compose=counting)
    await w.run_once()
    await store.enqueue([event("e2")], now=START + 1)  # sealed: the next window's
    clock.advance(5)
    await w.run_once()
    assert calls == [1]
    assert [m.payload for m in provider.requests] == [{"count": 1, "events": [["e1", {}]]}] * 2
    assert provider.requests[0].idempotency_key == provider.requests[1].idempotency_key


async def test_an_event_between_claim_and_seal_is_in_the_digest(
    store: Store, clock: ManualClock
) -> None:
    """An event that comes after the claim but before the seal is sent with the others;
    one after the seal goes to the next digest."""
    provider, cp = FlakyProvider(), Checkpoints()
    await store.enqueue([event("e1")], now=clock.now())
    clock.advance(WINDOW)
    pause = cp.pause("after_claim", worker_id="A")
    running = asyncio.create_task(worker(store, provider, clock, checkpoints=cp).run_once())
    await pause.reached()
    [between] = await store.enqueue([event("e2")], now=START + 10)
    pause.release()
    await running
    [after] = await store.enqueue([event("e3")], now=START + 20)
    assert after.delivery.id != between.delivery.id
    [sent] = provider.requests
    assert sent.delivery_id == between.delivery.id
    assert [e[0] for e in sent.payload["events"]] == ["e1", "e2"]


async def test_a_worker_that_lost_its_claim_seals_and_sends_nothing(
    store: Store, clock: ManualClock
) -> None:
    """A paused worker whose lease was taken over finds its claim gone at the seal: the
    digest goes out once, by the worker that holds it."""
    provider, cp = FlakyProvider(), Checkpoints()
    await store.enqueue([event("e1")], now=clock.now())
    clock.advance(WINDOW)
    pause = cp.pause("after_claim", worker_id="A")
    a = worker(store, provider, clock, checkpoints=cp)
    running = asyncio.create_task(a.run_once())
    await pause.reached()
    clock.advance(SETTINGS.lease + 1)
    b = worker(store, provider, clock, name="B")
    assert await b.run_once() == 1
    pause.release()
    await running
    assert len(provider.requests) == 1
    assert a.stats.claims_lost == 1


async def test_a_compose_error_dead_letters_the_digest(store: Store, clock: ManualClock) -> None:
    """Events that cannot be composed fail their digest (nothing sent), for an operator."""
    provider = FlakyProvider()

    def broken(d: Delivery, events: list[dict[str, Any]]) -> Any:
        raise KeyError("title")

    [r] = await store.enqueue([event("e1")], now=clock.now())
    clock.advance(WINDOW)
    await worker(store, provider, clock, compose=broken).run_once()
    assert provider.requests == []
    d = await store.get_delivery(r.delivery.idempotency_key)
    job = await store.get_job(r.delivery.id)
    assert d is not None
    assert d.status is DeliveryStatus.FAILED
    assert d.last_error is not None
    assert "could not be composed" in d.last_error
    assert job is not None
    assert job.status is JobStatus.DEAD


# -- the provider request rate --------------------------------------------------------


class SleepLog(ManualClock):
    """A manual clock that records how long the worker asked to sleep."""

    def __init__(self) -> None:
        super().__init__()
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        await asyncio.sleep(0)


async def test_rate_slots_are_shared_by_every_store(store: Store, database_url: str) -> None:
    """Two stores on one database (two processes) take one channel's slots in turn,
    ``1 / rate`` apart; a slot in the past is now."""
    other = open_store(database_url)
    await other.open()
    try:
        waits = [
            await s.take_rate_slot("email", 4.0, now=START) for s in (store, other, store, other)
        ]
        assert waits == [0.0, 0.25, 0.5, 0.75]
        assert await other.take_rate_slot("push", 4.0, now=START) == 0.0
        assert await store.take_rate_slot("email", 4.0, now=START + 10) == 0.0
        assert await other.take_rate_slot("email", 4.0, now=START + 10) == 0.25
    finally:
        await other.close()


async def test_the_worker_waits_for_its_rate_slot(store: Store) -> None:
    """A channel with ``rate = 2`` spaces its requests half a second apart, whichever
    worker sends them."""
    clock, provider = SleepLog(), FlakyProvider()
    await store.enqueue([item(f"k{i}") for i in range(4)], now=clock.now())
    metrics = Metrics()
    a = worker(store, provider, clock, rate=2.0, metrics=metrics)
    b = worker(store, provider, clock, name="B", rate=2.0, metrics=metrics)
    await asyncio.gather(a.run_once(), b.run_once())
    assert len(provider.requests) == 4
    assert sorted(clock.slept) == [0.5, 1.0, 1.5]
    shown = metrics.render().decode()
    assert 'kirim_rate_wait_seconds_count{channel="email"} 3.0' in shown
    assert 'kirim_rate_wait_seconds_sum{channel="email"} 3.0' in shown


async def test_a_slot_too_far_puts_the_job_back(store: Store, clock: ManualClock) -> None:
    """A slot further than the claim can wait puts the job back until then, without
    counting the claim as an attempt."""
    provider = FlakyProvider()
    await store.enqueue([item("k0"), item("k1")], now=clock.now())
    await worker(store, provider, clock, rate=0.01).run_once()
    assert len(provider.requests) == 1
    waiting = "k1" if provider.requests[0].idempotency_key == "k0" else "k0"
    d = await store.get_delivery(waiting)
    assert d is not None
    assert d.status is DeliveryStatus.PENDING
    job = await store.get_job(d.id)
    assert job is not None
    assert (job.status, job.attempts, job.run_at) == (
        JobStatus.RETRY_SCHEDULED,
        0,
        clock.now() + 100.0,
    )


async def test_a_backlog_on_a_slow_rate_drains(store: Store) -> None:
    """A rate whose slots are further apart than a claim can wait still sends every
    delivery of a backlog, one slot apart (a slot that was too far is not taken, so it
    is not lost: explorer finding, seed 2 of the full workload)."""
    clock, provider = SleepLog(), FlakyProvider()
    await store.enqueue([item(f"k{i}") for i in range(6)], now=clock.now())
    w = worker(store, provider, clock, rate=0.2)  # a slot every 5 s; a claim waits <= 12 s
    for _ in range(60):
        await w.run_once()
        if len(provider.requests) == 6:
            break
        due = await store.next_due_in(now=clock.now())
        clock.advance(max(0.5, due or 0.5))
    assert sorted(r.idempotency_key for r in provider.requests) == [f"k{i}" for i in range(6)]
    assert clock.now() - START < 6 * 5 + 30  # the backlog drained at about the rate


async def test_a_slot_out_of_reach_is_not_taken(store: Store, database_url: str) -> None:
    """A taker that cannot wait as long as the next slot leaves the row as it was, and
    learns how far the slot is."""
    assert await store.take_rate_slot("email", 0.1, now=START, within=1.0) == 0.0
    far = await store.take_rate_slot("email", 0.1, now=START, within=1.0)
    assert far == pytest.approx(10.0)
    assert await store.take_rate_slot("email", 0.1, now=START + 9.5, within=1.0) == (
        pytest.approx(0.5)
    )
    assert await store.take_rate_slot("email", 0.1, now=START + 9.5) == pytest.approx(10.5)


async def test_a_worker_without_the_type_sends_nothing(store: Store, clock: ManualClock) -> None:
    """A worker that does not know a delivery's type (a rolling upgrade, a worker
    without ``[types]``) neither sends the digest's empty placeholder nor skips the
    preference check: it retries, naming the type, and a worker that knows the type
    then seals and sends it (explorer finding: full workload seeds 0, 62, 186)."""
    provider = FlakyProvider()
    await store.enqueue([event("e1", n=1)], now=clock.now())
    clock.advance(WINDOW)
    blind = Worker(
        store,
        {"email": Channel(name="email", provider=provider)},
        settings=SETTINGS,
        worker_id="old",
        clock=clock,
    )
    assert await blind.run_once() == 1
    assert provider.requests == []
    [d] = await store.records(RecordFilter(), cursor=None, limit=5)
    assert d.delivery.status is DeliveryStatus.PENDING
    assert d.job is not None
    assert "notification type 'liked' is not configured on old" in (d.job.last_error or "")
    clock.advance(5.0)
    assert await worker(store, provider, clock).run_once() == 1
    [sent] = provider.requests
    assert sent.payload == {"count": 1, "events": [["e1", {"n": 1}]]}


async def test_a_request_late_for_its_rate_slot_does_not_leave(
    store: Store, clock: ManualClock
) -> None:
    """A worker pauses between its slot and its request for longer than the rate's
    slack: sending then would crowd the next slot's request, so nothing leaves and the
    job comes back one interval later, the claim not counted (explorer finding: full
    workload seeds 70, 125, rate_kept)."""
    provider = FlakyProvider()
    await store.enqueue([item("k0")], now=clock.now())
    checkpoints = Checkpoints()
    pause = checkpoints.pause("before_provider_request", worker_id="A")
    w = worker(store, provider, clock, rate=0.5, checkpoints=checkpoints)
    task = asyncio.create_task(w.run_once())
    await pause.reached()
    clock.advance(1.0)  # the slot's interval is 2 s; its slack 0.2 s
    pause.release()
    await task
    assert provider.requests == []
    d = await store.get_delivery("k0")
    assert d is not None
    job = await store.get_job(d.id)
    assert job is not None
    assert (job.status, job.attempts, job.run_at) == (
        JobStatus.RETRY_SCHEDULED,
        0,
        clock.now() + 2.0,
    )
    clock.advance(2.0)
    await w.run_once()
    assert [r.idempotency_key for r in provider.requests] == ["k0"]
