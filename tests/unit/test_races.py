"""The write-up's race scenarios, replayed step by step with checkpoints.

Each scenario runs under a provider that honours idempotency keys (the user gets
what ``effective`` counts) and one that does not (the user gets every request).
Two workers share one SQLite file through separate connections, as two processes
would; time moves only when the test advances the clock.
"""

from __future__ import annotations

import asyncio

import pytest

from kirim.model import AttemptStatus, DeliveryStatus, Doubt, JobStatus, OnUnknown
from kirim.providers.base import Message
from kirim.testing import Checkpoints, FlakyProvider, WorkerCrashed
from kirim.worker import WorkerSettings

LEASE = 10.0
SETTINGS = WorkerSettings(lease=LEASE, backoff_base=1.0, backoff_max=1.0)

pytestmark = pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])


def user_received(provider: FlakyProvider, key: str) -> int:
    """What the user got: a provider that honours keys delivers once per key."""
    return provider.effective(key)


async def two_workers(make_app, provider, **kw):
    cp = Checkpoints()
    a = await make_app(provider, **kw)
    b = await make_app(provider, **kw)
    wa = a.worker(settings=SETTINGS, worker_id="A", checkpoints=cp)
    wb = b.worker(settings=SETTINGS, worker_id="B", checkpoints=cp)
    n = await a.notify("48291", "1007", "push", {"title": "Your order shipped"})
    return a, wa, wb, cp, n


async def test_a_first_attempt_sends_but_never_writes_its_status(make_app, clock, idempotent):
    """(a) A sends and dies before its status write; B never makes the user get it twice."""
    provider = FlakyProvider(idempotent=idempotent)
    app, wa, wb, cp, n = await two_workers(make_app, provider)
    crash = cp.pause("before_commit", worker_id="A")
    crash.crash()
    await wa.run_once()
    assert (await crash.reached())["worker_id"] == "A"
    clock.advance(LEASE + 1)
    await wb.run_once()

    found = await app.get(n.delivery_id)
    delivery, job, attempts = found.delivery, found.job, found.attempts
    assert delivery.status is DeliveryStatus.SENT
    assert job.status is JobStatus.COMPLETED
    assert user_received(provider, n.idempotency_key) == 1
    if idempotent:
        assert provider.received(n.idempotency_key) == 2  # resent with the same key
        assert delivery.doubt is None
    else:
        assert provider.received(n.idempotency_key) == 1  # never resent blindly
        assert delivery.doubt is Doubt.ASSUMED_SENT
        assert [a.status for a in attempts] == [AttemptStatus.REQUESTED]


async def test_b_retry_runs_before_first_success_is_stored(make_app, clock, idempotent):
    """(b) The seed's regression test: A's success is stored late, after B's retry."""
    provider = FlakyProvider(idempotent=idempotent)
    app, wa, wb, cp, n = await two_workers(make_app, provider)
    late = cp.pause("before_commit", worker_id="A")
    task_a = asyncio.create_task(wa.run_once())
    await late.reached()
    clock.advance(LEASE + 1)  # A's lease expires while its success is unrecorded
    await wb.run_once()
    late.release()
    await task_a

    found = await app.get(n.delivery_id)
    delivery, job, attempts = found.delivery, found.job, found.attempts
    assert user_received(provider, n.idempotency_key) == 1
    assert delivery.status is DeliveryStatus.SENT
    assert job.status is JobStatus.COMPLETED
    assert wa.stats.late_successes == 1  # A's stale write was rejected, its fact kept
    assert attempts[0].status is AttemptStatus.SUCCEEDED
    if idempotent:
        assert [a.worker_id for a in attempts] == ["A", "B"]
    else:
        assert [a.worker_id for a in attempts] == ["A"]
        assert delivery.doubt is Doubt.RESOLVED  # B assumed sent; A's late success confirmed it
        assert delivery.provider_message_id == attempts[0].provider_message_id


async def test_c_two_workers_claim_at_once_and_one_wins(make_app, clock, idempotent):
    """(c) Two workers claiming the same notification together: exactly one gets it."""
    provider = FlakyProvider(idempotent=idempotent)
    app, wa, wb, _, n = await two_workers(make_app, provider)
    claimed = await asyncio.gather(wa.run_once(), wb.run_once())
    assert sorted(claimed) == [0, 1]
    found = await app.get(n.delivery_id)
    delivery, attempts = found.delivery, found.attempts
    assert delivery.status is DeliveryStatus.SENT
    assert len(attempts) == 1
    assert provider.received(n.idempotency_key) == 1


async def test_c_overlapping_worker_is_fenced_before_it_sends(make_app, clock, idempotent):
    """(c) A stalls after its claim; B takes over; A's write-ahead intent is refused."""
    provider = FlakyProvider(idempotent=idempotent)
    app, wa, wb, cp, n = await two_workers(make_app, provider)
    stall = cp.pause("after_claim", worker_id="A")
    task_a = asyncio.create_task(wa.run_once())
    await stall.reached()
    clock.advance(LEASE + 1)
    await wb.run_once()
    stall.release()
    await task_a

    found = await app.get(n.delivery_id)
    delivery, attempts = found.delivery, found.attempts
    assert delivery.status is DeliveryStatus.SENT
    assert [a.worker_id for a in attempts] == ["B"]
    assert wa.stats.claims_lost == 1
    assert provider.received(n.idempotency_key) == 1  # A sent nothing


async def test_d_two_inserts_of_the_same_delivery_at_once(make_app, clock, idempotent):
    """(d) Two producers record the same business action together: one delivery, one job."""
    provider = FlakyProvider(idempotent=idempotent)
    a = await make_app(provider)
    b = await make_app(provider)
    first, second = await asyncio.gather(
        a.notify("48291", "1007", "push", {"title": "hi"}),
        b.notify("48291", "1007", "push", {"title": "hi"}),
    )
    assert first.delivery_id == second.delivery_id
    assert sorted([first.created, second.created]) == [False, True]
    counts = await a.store.counts()
    assert counts["deliveries"] == {"pending": 1}
    assert counts["jobs"] == {"queued": 1}
    await a.worker(settings=SETTINGS, worker_id="A").run_once()
    assert provider.received(first.idempotency_key) == 1


async def test_e_provider_times_out_after_receiving(make_app, clock, idempotent):
    """(e) The provider accepted the request but the answer was lost."""
    provider = FlakyProvider(idempotent=idempotent, script=["accept_then_timeout"])
    app, wa, _, _, n = await two_workers(make_app, provider)
    await wa.run_once()
    found = await app.get(n.delivery_id)
    delivery, job, attempts = found.delivery, found.job, found.attempts
    assert attempts[0].status is AttemptStatus.UNKNOWN
    if idempotent:
        assert delivery.status is DeliveryStatus.PENDING  # safe to resend with the same key
        assert job.status is JobStatus.RETRY_SCHEDULED
        clock.advance(2)
        await wa.run_once()
        found = await app.get(n.delivery_id)
        delivery, job = found.delivery, found.job
        assert provider.received(n.idempotency_key) == 2
        assert delivery.doubt is None
    else:
        assert delivery.doubt is Doubt.ASSUMED_SENT  # at most once: no blind resend
        assert provider.received(n.idempotency_key) == 1
    assert delivery.status is DeliveryStatus.SENT
    assert job.status is JobStatus.COMPLETED
    assert user_received(provider, n.idempotency_key) == 1


async def test_e_hold_parks_the_delivery_for_an_operator(make_app, clock, idempotent):
    """(e) With on_unknown=hold a lost answer parks the delivery in doubt, unless the
    provider honours keys."""
    provider = FlakyProvider(idempotent=idempotent, script=["accept_then_timeout"])
    app, wa, _, _, n = await two_workers(make_app, provider, on_unknown=OnUnknown.HOLD)
    await wa.run_once()
    clock.advance(2)
    await wa.run_once()
    found = await app.get(n.delivery_id)
    delivery, job = found.delivery, found.job
    assert user_received(provider, n.idempotency_key) == 1
    if idempotent:
        assert delivery.status is DeliveryStatus.SENT
    else:
        assert delivery.status is DeliveryStatus.IN_DOUBT
        assert delivery.doubt is Doubt.HELD
        assert job.status is JobStatus.DEAD
        assert [d.delivery.id for d in await app.store.dead_letters()] == [n.delivery_id]


async def test_f_worker_killed_with_the_request_in_flight(make_app, clock, idempotent):
    """(f) A dies after its intent, with the request at the provider and no answer."""

    async def die(_: Message) -> None:
        raise WorkerCrashed("SIGKILL while waiting for the answer")

    provider = FlakyProvider(idempotent=idempotent, on_request=die)
    app, wa, wb, _, n = await two_workers(make_app, provider)
    await wa.run_once()
    provider.on_request = None
    found = await app.get(n.delivery_id)
    delivery, attempts = found.delivery, found.attempts
    assert delivery.status is DeliveryStatus.PROCESSING
    assert [a.status for a in attempts] == [AttemptStatus.REQUESTED]  # the intent survived
    clock.advance(LEASE + 1)
    await wb.run_once()

    found = await app.get(n.delivery_id)
    delivery, job = found.delivery, found.job
    assert delivery.status is DeliveryStatus.SENT
    assert job.status is JobStatus.COMPLETED
    assert user_received(provider, n.idempotency_key) == 1
    if not idempotent:
        assert provider.received(n.idempotency_key) == 1
        assert delivery.doubt is Doubt.ASSUMED_SENT


async def test_f_worker_killed_before_the_request_left(make_app, clock, idempotent):
    """(f) A dies between its intent and the request: at most once, and reported in doubt."""
    provider = FlakyProvider(idempotent=idempotent)
    app, wa, wb, cp, n = await two_workers(make_app, provider)
    cp.pause("before_provider_request", worker_id="A").crash()
    await wa.run_once()
    clock.advance(LEASE + 1)
    await wb.run_once()

    delivery = (await app.get(n.delivery_id)).delivery
    assert delivery.status is DeliveryStatus.SENT
    if idempotent:
        assert user_received(provider, n.idempotency_key) == 1
    else:
        # kirim cannot know the request never left: it does not resend, and says so.
        assert provider.received(n.idempotency_key) == 0
        assert delivery.doubt is Doubt.ASSUMED_SENT


async def test_g_stalled_worker_wakes_after_takeover(make_app, clock, idempotent):
    """(g) A stalls past its lease just before sending; B takes over; A wakes and, its
    intent's send deadline gone, sends nothing."""
    provider = FlakyProvider(idempotent=idempotent)
    app, wa, wb, cp, n = await two_workers(make_app, provider)
    stall = cp.pause("before_provider_request", worker_id="A")
    task_a = asyncio.create_task(wa.run_once())
    await stall.reached()
    clock.advance(LEASE + 1)
    await wb.run_once()
    assert wb.stats.in_doubt_seen == 1  # B saw A's intent and did not send blindly
    stall.release()
    await task_a
    for _ in range(3):  # a withdrawn assumption is sent again after its backoff
        clock.advance(LEASE)
        await wb.run_once()

    found = await app.get(n.delivery_id)
    delivery, job, attempts = found.delivery, found.job, found.attempts
    assert user_received(provider, n.idempotency_key) == 1
    assert delivery.status is DeliveryStatus.SENT
    assert job.status is JobStatus.COMPLETED
    assert wa.stats.not_sent == 1
    assert attempts[0].worker_id == "A"
    assert attempts[0].status is AttemptStatus.FAILED_TRANSIENT  # recorded as not sent
    assert provider.received(n.idempotency_key) == 1  # only B's request left


async def test_heartbeat_keeps_a_slow_send_from_looking_dead(make_app, clock, idempotent):
    """A slow provider call renews its lease, so no other worker takes over."""
    answer = asyncio.Event()
    at_provider = asyncio.Event()

    async def slow(_: Message) -> None:
        at_provider.set()
        await answer.wait()

    provider = FlakyProvider(idempotent=idempotent, on_request=slow)
    app, wa, wb, _, n = await two_workers(make_app, provider)
    task_a = asyncio.create_task(wa.run_once())
    await at_provider.wait()
    for _ in range(3):  # three lease lengths in all, renewed as it goes
        clock.advance(LEASE * 0.9)
        assert await wa.heartbeat() == []
    assert await wb.run_once() == 0
    answer.set()
    await task_a
    delivery = (await app.get(n.delivery_id)).delivery
    assert delivery.status is DeliveryStatus.SENT
    assert provider.received(n.idempotency_key) == 1
