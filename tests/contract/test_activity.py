"""The store's activity read (the dashboard's chart) on both backends: real deliveries
with real outcomes, written by a real worker at times the test sets."""

from __future__ import annotations

import math

import pytest

from kirim.model import DeliveryStatus, Doubt, OnUnknown
from kirim.store.base import MAX_ACTIVITY_BUCKETS, ActivityBucket
from kirim.testing import FlakyProvider, ManualClock
from kirim.worker import WorkerSettings

T0 = 1_800_000_000.0  # the start of a minute
SETTINGS = WorkerSettings(lease=10)


async def deliver(app, clock: ManualClock, at: float, event: str, channel: str) -> int:
    """One notification recorded and worked on at ``at`` (its outcome: the provider's)."""
    clock.set(at)
    created = await app.notify(event, "u", channel, {"e": event})
    await app.worker(settings=SETTINGS, worker_id="w").run_once()
    return created.delivery_id


@pytest.fixture
async def history(make_app, clock: ManualClock) -> dict[str, int]:
    """Minute 0: one sent. Minute 1: one failed, one sent under assume_sent, one failed
    then retried (pending now). Minute 2: one held in doubt, one sent. Minute 3:
    nothing. And one pending, one canceled: no outcome."""
    sending = await make_app(FlakyProvider(), channel="ok")
    refusing = await make_app(FlakyProvider(script=["permanent", "permanent"]))
    assuming = await make_app(
        FlakyProvider(idempotent=False, script=["accept_then_timeout"]), channel="assume"
    )
    holding = await make_app(
        FlakyProvider(idempotent=False, script=["accept_then_timeout"]),
        channel="hold",
        on_unknown=OnUnknown.HOLD,
    )
    ids = {
        "sent": await deliver(sending, clock, T0 + 5, "sent", "ok"),
        "failed": await deliver(refusing, clock, T0 + 65, "failed", "push"),
        "assumed": await deliver(assuming, clock, T0 + 70, "assumed", "assume"),
        "retried": await deliver(refusing, clock, T0 + 80, "retried", "push"),
        "held": await deliver(holding, clock, T0 + 130, "held", "hold"),
        "sent2": await deliver(sending, clock, T0 + 135, "sent2", "ok"),
    }
    clock.set(T0 + 150)
    assert await refusing.store.retry_dead(ids["retried"], now=clock.now())
    ids["pending"] = (await refusing.notify("later", "u", "push", {})).delivery_id
    canceled = await refusing.notify("canceled", "u", "push", {})
    assert await refusing.store.cancel(canceled.delivery_id, now=clock.now())
    store = refusing.store
    seen = {k: await store.get_delivery(str(v), by="id") for k, v in ids.items()}
    assert {k: (d.status, d.doubt) for k, d in seen.items() if d is not None} == {
        "sent": (DeliveryStatus.SENT, None),
        "failed": (DeliveryStatus.FAILED, None),
        "assumed": (DeliveryStatus.SENT, Doubt.ASSUMED_SENT),
        "retried": (DeliveryStatus.PENDING, None),
        "held": (DeliveryStatus.IN_DOUBT, Doubt.HELD),
        "sent2": (DeliveryStatus.SENT, None),
        "pending": (DeliveryStatus.PENDING, None),
    }
    return ids


def b(start: float, sent: int = 0, failed: int = 0, in_doubt: int = 0) -> ActivityBucket:
    return ActivityBucket(start=start, sent=sent, failed=failed, in_doubt=in_doubt)


async def test_each_delivery_counts_once_in_the_bucket_of_its_outcome(make_app, history) -> None:
    """Sent at sent_at, failed and held at updated_at, assumed sent as in doubt (not as
    sent); a retried dead letter, a pending and a canceled delivery count nowhere;
    empty buckets are listed."""
    store = (await make_app()).store
    found = await store.activity(since=T0, until=T0 + 240, bucket=60)
    assert found == [
        b(T0, sent=1),
        b(T0 + 60, failed=1, in_doubt=1),
        b(T0 + 120, sent=1, in_doubt=1),
        b(T0 + 180),
    ]


async def test_the_window_includes_since_and_excludes_until(make_app, history) -> None:
    """[since, until): the sent one at T0+5 is in, the failed one at T0+65 is out; the
    last bucket may be cut short by until."""
    store = (await make_app()).store
    found = await store.activity(since=T0 + 5, until=T0 + 65, bucket=25)
    assert found == [b(T0 + 5, sent=1), b(T0 + 30), b(T0 + 55)]
    assert await store.activity(since=T0 + 6, until=T0 + 65, bucket=60) == [b(T0 + 6)]
    assert await store.activity(since=T0, until=T0 + 5, bucket=60) == [b(T0)]  # sent at +5
    whole = await store.activity(since=T0, until=T0 + 3600, bucket=3600)
    assert whole == [b(T0, sent=2, failed=1, in_doubt=2)]


async def test_an_empty_window_is_empty_and_a_bad_one_is_refused(make_app) -> None:
    """since == until: no bucket. A bucket <= 0, until before since, a number that is
    not finite, or more than MAX_ACTIVITY_BUCKETS buckets: ValueError."""
    store = (await make_app()).store
    assert await store.activity(since=T0, until=T0, bucket=60) == []
    assert await store.activity(since=T0, until=T0 + 1, bucket=60) == [b(T0)]
    too_many = T0 + 60 * (MAX_ACTIVITY_BUCKETS + 1)
    for since, until, bucket in [
        (T0, T0 + 60, 0),
        (T0, T0 + 60, -60),
        (T0 + 60, T0, 60),
        (math.nan, T0, 60),
        (T0, math.inf, 60),
        (T0, T0 + 60, math.nan),
        (T0, too_many, 60),
    ]:
        with pytest.raises(ValueError, match="activity"):
            await store.activity(since=since, until=until, bucket=bucket)
