"""Recipients' preferences in the ledger, and the claim-time check (both backends)."""

from __future__ import annotations

import json
from datetime import datetime, time
from zoneinfo import ZoneInfo

import pytest

from kirim.keys import payload_hash
from kirim.model import AttemptStatus, DeliveryStatus, Doubt, JobStatus, OnUnknown
from kirim.observe.metrics import Metrics
from kirim.preferences import Preferences, Reason, TypePolicy, Window
from kirim.store.base import ClaimKind, Intent, NewDelivery
from kirim.testing import FlakyProvider
from kirim.worker import Worker, WorkerSettings

SHIPPED = TypePolicy(name="order_shipped")
POLICIES = {"order_shipped": SHIPPED}
BERLIN = ZoneInfo("Europe/Berlin")
LEASE = 30.0


def local(text: str, zone: ZoneInfo = BERLIN) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


async def typed(app, n: int = 0, *, recipient_id: str = "u1", type_: str | None = "order_shipped"):
    """A delivery of a notification type, as notify_event records it (pending)."""
    body = json.dumps({"n": n})
    item = NewDelivery(
        idempotency_key=f"key-{recipient_id}-{n}",
        event_id=f"e{n}",
        recipient=f"addr-{recipient_id}",
        channel="push",
        payload_json=body,
        payload_hash=payload_hash(body),
        run_at=None,
        max_attempts=8,
        type=type_,
        recipient_id=recipient_id,
    )
    [result] = await app.store.enqueue([item], now=app.clock.now())
    assert result.delivery.status is DeliveryStatus.PENDING
    return result.delivery


def worker(app, provider_metrics: Metrics | None = None, policies=POLICIES) -> Worker:
    return Worker(
        app.store,
        app.channels(),
        settings=WorkerSettings(lease=LEASE),
        clock=app.clock,
        metrics=provider_metrics,
        policies=policies,
    )


async def set_prefs(app, recipient_id: str = "u1", **fields) -> Preferences:
    return await app.set_preferences(Preferences(recipient_id=recipient_id, **fields))


# -- the Recipients role ---------------------------------------------------------------


async def test_preferences_are_stored_replaced_and_forgotten(make_app, clock) -> None:
    """set stores the whole document at the store's time; a second set replaces it."""
    app = await make_app()
    assert await app.preferences("u1") is None
    first = await set_prefs(
        app,
        opt_out=True,
        channels={"order_shipped:email": False},
        timezone="Europe/Berlin",
        quiet_hours=Window(time(22), time(7)),
    )
    assert first.updated_at == clock.now()
    assert await app.preferences("u1") == first
    clock.advance(60)
    second = await set_prefs(app, channels={"*:sms": True})
    assert second == Preferences(
        recipient_id="u1", channels={"*:sms": True}, updated_at=clock.now()
    )
    assert await app.preferences("u1") == second
    await set_prefs(app, "u2", opt_out=True)
    found = await app.store.preferences_of(["u1", "u2", "nobody", "u1"])
    assert sorted(found) == ["u1", "u2"]
    assert found["u2"].opt_out
    assert await app.store.preferences_of([]) == {}
    assert await app.delete_preferences("u1") is True
    assert await app.delete_preferences("u1") is False
    assert await app.preferences("u1") is None


async def test_another_connection_sees_a_change(make_app) -> None:
    """Preferences live in the ledger: a second app (its own connection) reads them."""
    one, other = await make_app(), await make_app()
    await set_prefs(one, "u-\u00e9/7", opt_out=True)
    found = await other.preferences("u-\u00e9/7")
    assert found is not None
    assert found.opt_out


async def test_a_hand_built_bad_preference_is_refused(make_app) -> None:
    """set_preferences checks a Preferences built by hand too, naming the field."""
    app = await make_app()
    with pytest.raises(ValueError, match="timezone"):
        await set_prefs(app, timezone="Nowhere/Land")
    with pytest.raises(ValueError, match="recipient_id"):
        await app.preferences(" ")
    assert await app.preferences("u1") is None


# -- the claim-time check --------------------------------------------------------------


async def test_an_opt_out_set_between_enqueue_and_claim_wins(make_app) -> None:
    """The claim reads the preferences as they are now: suppressed with the reason, its
    job completed, nothing sent, counted by reason; another recipient's goes."""
    provider = FlakyProvider()
    app = await make_app(provider)
    mine = await typed(app, 1)
    theirs = await typed(app, 2, recipient_id="u2")
    await set_prefs(app, opt_out=True)
    metrics = Metrics()
    w = worker(app, metrics)
    await w.run_once()
    record = await app.get(mine.id)
    assert record is not None
    d, job, attempts = record.delivery, record.job, record.attempts
    assert (d.status, d.reason) == (DeliveryStatus.SUPPRESSED, "opted_out")
    assert job is not None
    assert job.status is JobStatus.COMPLETED
    assert attempts == []
    assert provider.received(mine.idempotency_key) == 0
    other = await app.get(theirs.id)
    assert other is not None
    assert other.delivery.status is DeliveryStatus.SENT
    assert w.stats.suppressed == 1
    assert b'kirim_suppressed_total{channel="push",reason="opted_out"} 1.0' in metrics.render()


async def test_a_channel_opt_out_suppresses_only_that_type(make_app) -> None:
    """order_shipped:push off: that type is suppressed, a delivery of no type is sent."""
    provider = FlakyProvider()
    app = await make_app(provider)
    shipped = await typed(app, 1)
    plain = await typed(app, 2, type_=None)
    await set_prefs(app, channels={"order_shipped:push": False})
    await worker(app).run_once()
    first, second = await app.get(shipped.id), await app.get(plain.id)
    assert first is not None
    assert second is not None
    assert (first.delivery.status, first.delivery.reason) == (
        DeliveryStatus.SUPPRESSED,
        "channel_opted_out",
    )
    assert second.delivery.status is DeliveryStatus.SENT
    assert second.delivery.reason is None


async def test_a_worker_without_the_types_does_not_send_them(make_app) -> None:
    """A worker given no types cannot check a typed delivery's preferences: it sends
    nothing and retries, naming the type (it had sent past an opt-out)."""
    provider = FlakyProvider()
    app = await make_app(provider)
    d = await typed(app, 1)
    await set_prefs(app, opt_out=True)
    await worker(app, policies=None).run_once()
    found = await app.get(d.id)
    assert found is not None
    assert found.delivery.status is DeliveryStatus.PENDING
    assert provider.requests == []
    assert found.job is not None
    assert "notification type 'order_shipped' is not configured" in (found.job.last_error or "")


async def test_a_critical_type_ignores_an_opt_out_at_claim(make_app) -> None:
    provider = FlakyProvider()
    app = await make_app(provider)
    d = await typed(app, 1)
    await set_prefs(app, opt_out=True, quiet_hours=Window(time(0), time(23, 59)))
    critical = {"order_shipped": TypePolicy(name="order_shipped", critical=True)}
    await worker(app, policies=critical).run_once()
    found = await app.get(d.id)
    assert found is not None
    assert found.delivery.status is DeliveryStatus.SENT
    assert provider.received(d.idempotency_key) == 1


async def test_quiet_hours_at_claim_defer_the_job_to_their_end(make_app, clock) -> None:
    """Claimed at 23:30 in Berlin with quiet hours 22:00-07:00 on the night the clocks
    go forward: not returned, its job due at 07:00 CEST, the claim not counted; at
    07:00 it is claimed and sent."""
    provider = FlakyProvider()
    app = await make_app(provider)
    clock.set(local("2026-03-28T23:30"))
    d = await typed(app, 1)
    await set_prefs(app, timezone="Europe/Berlin", quiet_hours=Window(time(22), time(7)))
    claims = await app.store.claim(
        worker_id="w1", now=clock.now(), lease=LEASE, limit=10, policies=POLICIES
    )
    assert claims == []
    record = await app.get(d.id)
    assert record is not None
    delivery, job = record.delivery, record.job
    assert delivery.status is DeliveryStatus.PENDING
    assert delivery.claim_token is None
    assert job is not None
    assert job.status is JobStatus.QUEUED
    assert job.attempts == 0
    assert job.lease_owner is None
    opening = local("2026-03-29T07:00")
    assert job.run_at == opening
    assert opening - clock.now() == 6.5 * 3600  # an hour shorter than on other nights
    clock.set(opening - 1)
    assert await app.store.claim(worker_id="w1", now=clock.now(), lease=LEASE, limit=10) == []
    clock.set(opening)
    await worker(app).run_once()
    record = await app.get(d.id)
    assert record is not None
    assert record.delivery.status is DeliveryStatus.SENT
    assert record.job is not None
    assert record.job.attempts == 1
    assert provider.received(d.idempotency_key) == 1


async def test_an_opt_out_during_a_deferral_suppresses_at_the_opening(make_app, clock) -> None:
    """Deferred by quiet hours, then opted out: the claim at the opening suppresses."""
    provider = FlakyProvider()
    app = await make_app(provider)
    clock.set(local("2026-07-01T23:00"))
    d = await typed(app, 1)
    await set_prefs(app, timezone="Europe/Berlin", quiet_hours=Window(time(22), time(7)))
    await worker(app).run_once()
    await set_prefs(app, timezone="Europe/Berlin", opt_out=True)
    clock.set(local("2026-07-02T07:00"))
    await worker(app).run_once()
    record = await app.get(d.id)
    assert record is not None
    assert record.delivery.status is DeliveryStatus.SUPPRESSED
    assert provider.requests == []


async def test_a_delivery_an_earlier_request_may_have_reached_is_not_suppressed(
    make_app, clock
) -> None:
    """A request left and its worker died: suppressing would say it was never sent, so
    the claim goes on (the in-doubt policy decides)."""
    app = await make_app()
    d = await typed(app, 1)
    [c] = await app.store.claim(
        worker_id="w1", now=clock.now(), lease=LEASE, limit=10, policies=POLICIES
    )
    intent = Intent(
        delivery_id=c.delivery.id,
        job_id=c.job.id,
        token=c.token,
        number=c.job.attempts,
        provider_request_id="req-1",
        worker_id="w1",
        requested_at=clock.now(),
    )
    assert await app.store.record_intents([intent]) == [True]
    await set_prefs(app, opt_out=True)
    clock.advance(LEASE + 1)
    assert await app.store.reap(now=clock.now())
    [again] = await app.store.claim(
        worker_id="w2", now=clock.now(), lease=LEASE, limit=10, policies=POLICIES
    )
    assert again.kind is ClaimKind.CLAIMED
    assert again.suppressed is None
    assert [a.provider_request_id for a in again.doubtful] == ["req-1"]
    assert again.delivery.id == d.id
    assert again.delivery.status is DeliveryStatus.PROCESSING


async def _in_doubt(app, clock) -> object:
    """A typed delivery whose first request's answer was lost (it may have arrived)."""
    d = await typed(app, 1)
    await worker(app).run_once()
    record = await app.get(d.id)
    assert record is not None
    assert record.attempts[0].status.value == "unknown"
    assert record.delivery.status is DeliveryStatus.PENDING  # an idempotent channel resends
    clock.advance(600)  # past any backoff
    return d


@pytest.mark.parametrize("on_unknown", [OnUnknown.ASSUME_SENT, OnUnknown.HOLD])
async def test_an_opt_out_after_a_doubtful_request_sends_nothing_more(
    make_app, clock, on_unknown
) -> None:
    """An earlier request may have arrived, then the recipient opts out: the next claim
    sends nothing more (its resend of the same key was safe, not wanted), and the
    channel's policy settles the doubt: assumed sent, or held (explorer finding: full
    workload seeds 98, 163; on main the provider got a second request)."""
    provider = FlakyProvider(script=["accept_then_timeout"])
    app = await make_app(provider, on_unknown=on_unknown)
    d = await _in_doubt(app, clock)
    await set_prefs(app, opt_out=True)
    await worker(app).run_once()
    assert provider.received(d.idempotency_key) == 1
    record = await app.get(d.id)
    assert record is not None
    if on_unknown is OnUnknown.ASSUME_SENT:
        assert (record.delivery.status, record.delivery.doubt) == (
            DeliveryStatus.SENT,
            Doubt.ASSUMED_SENT,
        )
    else:
        assert (record.delivery.status, record.delivery.doubt) == (
            DeliveryStatus.IN_DOUBT,
            Doubt.HELD,
        )
        assert "opted_out" in (record.delivery.last_error or "")


async def test_an_opt_out_after_a_request_the_provider_never_had_records_it_so(
    make_app, clock
) -> None:
    """An earlier request's answer was lost, then the recipient opts out; the provider,
    asked once the request has settled, has nothing: the delivery is suppressed (doubt
    resolved) and its request recorded as not processed, not left ``unknown`` beside a
    delivery that claims certainty (explorer: the events lane counted such deliveries as
    unreported doubt, 27 in 800 seeds of the random policy)."""
    provider = FlakyProvider(idempotent=False, script=["ambiguous"])
    app = await make_app(provider, lookup=True)
    d = await _in_doubt(app, clock)
    await set_prefs(app, opt_out=True)
    clock.advance(3600)  # the first request has settled
    await worker(app).run_once()
    record = await app.get(d.id)
    assert record is not None
    assert (record.delivery.status, record.delivery.doubt) == (
        DeliveryStatus.SUPPRESSED,
        Doubt.RESOLVED,
    )
    assert [a.status for a in record.attempts] == [AttemptStatus.FAILED_TRANSIENT]
    assert provider.received(d.idempotency_key) == 1


async def test_quiet_hours_after_a_doubtful_request_defer_the_resend(make_app, clock) -> None:
    """An earlier request may have arrived, then quiet hours begin: the resend waits for
    their end (a deferral is always safe), then goes."""
    provider = FlakyProvider(script=["accept_then_timeout"])
    app = await make_app(provider)
    clock.set(local("2026-07-01T21:00"))
    d = await _in_doubt(app, clock)  # 21:10
    await set_prefs(app, timezone="Europe/Berlin", quiet_hours=Window(time(21, 5), time(7)))
    await worker(app).run_once()
    assert provider.received(d.idempotency_key) == 1
    record = await app.get(d.id)
    assert record is not None
    assert record.job is not None
    assert record.job.run_at == local("2026-07-02T07:00")
    clock.set(local("2026-07-02T07:00"))
    await worker(app).run_once()
    assert provider.received(d.idempotency_key) == 2  # the same key: the provider dedups
    assert provider.effective(d.idempotency_key) == 1


async def test_a_suppressing_claim_says_so(make_app) -> None:
    """The claim is a NOOP naming the reason; the job it carries is the completed one."""
    app = await make_app()
    d = await typed(app, 1)
    await set_prefs(app, channels={"*:push": False})
    [c] = await app.store.claim(
        worker_id="w1", now=app.clock.now(), lease=LEASE, limit=10, policies=POLICIES
    )
    assert c.kind is ClaimKind.NOOP
    assert c.suppressed == Reason.CHANNEL_OPTED_OUT
    assert c.reason == "suppressed: channel_opted_out"
    assert c.delivery.id == d.id
    assert c.delivery.status is DeliveryStatus.SUPPRESSED
    assert c.job.status is JobStatus.COMPLETED
    assert c.job.attempts == 0


# -- end to end: notify_event, then the app's own worker ----------------------------------


async def test_notify_event_then_an_opt_out_then_the_apps_worker(database_url, clock) -> None:
    """The fan-out sees no preference and records pending; the recipient opts out of the
    type on push before a worker comes; the app's worker (its types as policies)
    suppresses it and sends nothing. The enqueue-time check and the claim-time check
    agree on the reason."""
    from kirim.channels import Channel
    from kirim.config import Config
    from kirim.engine import Kirim
    from kirim.notify.types import NotificationType, Templates

    provider = FlakyProvider()
    shipped = NotificationType(
        name="order_shipped", templates={"push": Templates(parts={"title": "Order {{ n }}"})}
    )
    app = Kirim(
        Config(database=database_url),
        channels={"push": Channel(name="push", provider=provider)},
        clock=clock,
        types=[shipped],
    )
    await app.open(migrate=True)
    try:
        first = await app.notify_event("order_shipped", ["u1"], {"n": 1}, event_id="e1")
        await set_prefs(app, channels={"order_shipped:push": False})
        metrics = Metrics()
        w = app.worker(metrics=metrics)
        assert w.policies == {"order_shipped": shipped.policy}
        await w.run_once()
        [made] = first.deliveries
        record = await app.get(made.delivery_id)
        assert record is not None
        assert (record.delivery.status, record.delivery.reason) == (
            DeliveryStatus.SUPPRESSED,
            "channel_opted_out",
        )
        assert provider.requests == []
        assert w.stats.suppressed == 1
        # the same preference at enqueue time: suppressed at once, with the same reason
        later = await app.notify_event("order_shipped", ["u1"], {"n": 2}, event_id="e2")
        [again] = later.deliveries
        found = await app.get(again.delivery_id)
        assert found is not None
        assert (found.delivery.status, found.delivery.reason) == (
            DeliveryStatus.SUPPRESSED,
            "channel_opted_out",
        )
    finally:
        await app.close()
