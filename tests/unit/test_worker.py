"""The worker's decisions: retries with backoff, dead letters, schedules, lookups."""

from __future__ import annotations

import io
import json
import random
from datetime import timedelta

import pytest

from kirim.channels import Channel
from kirim.model import (
    Attempt,
    AttemptStatus,
    DeliveryStatus,
    Doubt,
    JobStatus,
    OnUnknown,
)
from kirim.observe.logging import configure
from kirim.providers.base import Sent
from kirim.store.base import Claim, ClaimKind
from kirim.testing import FlakyProvider, ManualClock
from kirim.worker import WorkerSettings
from kirim.worker.decisions import Decisions, Lookup
from record_kit import claimed_rows

SETTINGS = WorkerSettings(lease=10, backoff_base=1.0, backoff_max=8.0)


async def test_transient_failures_retry_with_backoff_then_succeed(make_app, clock) -> None:
    """A refused request is retried after a backoff and then delivered once."""
    provider = FlakyProvider(idempotent=False, script=["transient", "transient"])
    app = await make_app(provider)
    n = await app.notify("e", "u", "push", {})
    worker = app.worker(settings=SETTINGS, worker_id="A")
    for _ in range(3):
        await worker.run_once()
        job = await app.store.get_job(n.delivery_id)
        clock.set(job.run_at)
    record = await app.get(n.delivery_id)
    delivery, job, attempts = record.delivery, record.job, record.attempts
    assert delivery.status is DeliveryStatus.SENT
    assert [a.status for a in attempts] == [
        AttemptStatus.FAILED_TRANSIENT,
        AttemptStatus.FAILED_TRANSIENT,
        AttemptStatus.SUCCEEDED,
    ]
    assert job.attempts == 3
    assert worker.stats.retries == 2
    assert provider.effective(n.idempotency_key) == 1


async def test_retry_waits_until_its_backoff_is_due(make_app, clock) -> None:
    """A scheduled retry is not claimed before its run_at."""
    provider = FlakyProvider(script=["transient"], retry_after=30)
    app = await make_app(provider)
    n = await app.notify("e", "u", "push", {})
    worker = app.worker(settings=SETTINGS, worker_id="A")
    await worker.run_once()
    job = await app.store.get_job(n.delivery_id)
    assert job.status is JobStatus.RETRY_SCHEDULED
    assert job.run_at >= clock.now() + 30  # Retry-After outranks a shorter backoff
    clock.advance(29)
    assert await worker.run_once() == 0
    clock.advance(2)
    assert await worker.run_once() == 1


async def test_exhausted_attempts_dead_letter_the_delivery(make_app, clock) -> None:
    """After max_attempts refusals the delivery fails and its job is dead."""
    provider = FlakyProvider(script=["transient"] * 3)
    app = await make_app(provider, max_attempts=3)
    n = await app.notify("e", "u", "push", {})
    worker = app.worker(settings=SETTINGS, worker_id="A")
    for _ in range(3):
        await worker.run_once()
        clock.advance(60)
    record = await app.get(n.delivery_id)
    delivery, job = record.delivery, record.job
    assert delivery.status is DeliveryStatus.FAILED
    assert job.status is JobStatus.DEAD
    assert "attempts exhausted" in job.last_error
    assert await worker.run_once() == 0


async def test_permanent_failure_is_not_retried(make_app, clock) -> None:
    """A 4xx refusal fails the delivery at once and dead-letters the job."""
    app = await make_app(FlakyProvider(script=["permanent"]))
    n = await app.notify("e", "u", "push", {})
    await app.worker(settings=SETTINGS, worker_id="A").run_once()
    record = await app.get(n.delivery_id)
    delivery, job, attempts = record.delivery, record.job, record.attempts
    assert delivery.status is DeliveryStatus.FAILED
    assert job.status is JobStatus.DEAD
    assert len(attempts) == 1


async def test_scheduled_send_waits_until_due(make_app, clock) -> None:
    """send_after keeps the notification back until its time."""
    provider = FlakyProvider()
    app = await make_app(provider)
    n = await app.notify("e", "u", "push", {}, send_after=timedelta(minutes=10))
    worker = app.worker(settings=SETTINGS, worker_id="A")
    assert await worker.run_once() == 0
    clock.advance(601)
    assert await worker.run_once() == 1
    assert provider.received(n.idempotency_key) == 1


async def test_lookup_reconciles_before_resending(make_app, clock) -> None:
    """A channel with lookup asks the provider and does not resend what it accepted."""
    provider = FlakyProvider(idempotent=False, script=["accept_then_timeout"])
    app = await make_app(provider, lookup=True)
    n = await app.notify("e", "u", "push", {})
    worker = app.worker(settings=SETTINGS, worker_id="A")
    await worker.run_once()
    clock.advance(60)
    await worker.run_once()
    delivery = (await app.get(n.delivery_id)).delivery
    assert delivery.status is DeliveryStatus.SENT
    assert delivery.doubt is Doubt.RESOLVED
    assert delivery.provider_message_id is not None
    assert provider.received(n.idempotency_key) == 1


async def test_operator_retry_of_a_held_delivery_sends_again(make_app, clock) -> None:
    """Retrying a held delivery is the operator's decision to send again."""
    from kirim.model import OnUnknown

    provider = FlakyProvider(idempotent=False, script=["accept_then_timeout"])
    app = await make_app(provider, on_unknown=OnUnknown.HOLD)
    n = await app.notify("e", "u", "push", {})
    worker = app.worker(settings=SETTINGS, worker_id="A")
    await worker.run_once()
    assert (await app.store.get_delivery(str(n.delivery_id))).status is DeliveryStatus.IN_DOUBT
    clock.advance(60)  # past the attempt's settles_at: nothing more can land from it
    assert await app.store.retry_dead(n.delivery_id, now=clock.now())
    await worker.run_once()
    delivery = (await app.get(n.delivery_id)).delivery
    assert delivery.status is DeliveryStatus.SENT
    assert provider.received(n.idempotency_key) == 2  # the operator chose to resend


@pytest.mark.parametrize("attempts", [1, 2, 5, 12])
def test_backoff_is_full_jitter_under_a_cap(attempts: int) -> None:
    """Backoff is uniform between 0 and min(max, base * 2^(n-1))."""
    worker = Decisions(settings=SETTINGS, clock=ManualClock(), rng=random.Random(1))
    cap = min(8.0, 1.0 * 2 ** (attempts - 1))
    draws = [worker.backoff(attempts) for _ in range(200)]
    assert all(0 <= d <= cap for d in draws)
    assert max(draws) > cap * 0.8


def _doubtful_claim(*, requested_at: float = 0.0, unsettled_until: float | None = None) -> Claim:
    """A claim whose one earlier request (``req-1``) may have reached the provider."""
    delivery, job = claimed_rows(1)
    earlier = Attempt(
        id=1,
        delivery_id=1,
        job_id=1,
        number=1,
        provider_request_id="req-1",
        worker_id="A",
        status=AttemptStatus.UNKNOWN,
        provider_message_id=None,
        error="timeout",
        requested_at=requested_at,
        completed_at=None,
    )
    return Claim(
        kind=ClaimKind.CLAIMED,
        job=job,
        delivery=delivery,
        token="t",
        doubtful=(earlier,),
        now=50.0,
        unsettled_until=unsettled_until,
    )


@pytest.mark.parametrize(
    ("idempotent", "on_unknown", "dedup_window", "decision", "status", "forgot"),
    [
        (True, OnUnknown.ASSUME_SENT, None, "resend_same_key", None, False),
        (True, OnUnknown.HOLD, 10.0, "hold", DeliveryStatus.IN_DOUBT, True),
        (False, OnUnknown.RETRY, None, "resend_at_least_once", None, False),
        (False, OnUnknown.HOLD, None, "hold", DeliveryStatus.IN_DOUBT, False),
        (False, OnUnknown.ASSUME_SENT, None, "assume_sent", DeliveryStatus.SENT, False),
    ],
)
def test_in_doubt_policy_without_a_lookup(
    idempotent: bool,
    on_unknown: OnUnknown,
    dedup_window: float | None,
    decision: str,
    status: DeliveryStatus | None,
    forgot: bool,
) -> None:
    """The in-doubt decision is pure: a key honoured (and remembered) resends, else the
    channel's on_unknown decides; a key past its dedup window counts as forgotten."""
    decide = Decisions(settings=SETTINGS, clock=ManualClock(), rng=random.Random(1))
    channel = Channel(
        name="push",
        provider=FlakyProvider(idempotent=idempotent),
        on_unknown=on_unknown,
        dedup_window=dedup_window,
    )
    choice = decide.in_doubt(_doubtful_claim(), channel, None)
    assert (choice.decision, choice.key_forgotten) == (decision, forgot)
    assert choice.fields == {"earlier_requests": ["req-1"]}
    if status is None:
        assert choice.finish is None
    else:
        assert choice.finish is not None
        assert choice.finish.delivery_status is status


def test_in_doubt_policy_after_a_lookup() -> None:
    """Found: sent (resolved); not found: send, unless an earlier request may still land;
    a failed lookup: retry later."""
    decide = Decisions(settings=SETTINGS, clock=ManualClock(), rng=random.Random(1))
    channel = Channel(name="push", provider=FlakyProvider(), lookup=True)
    found = decide.in_doubt(
        _doubtful_claim(), channel, Lookup(found=Sent(provider_message_id="p-1"))
    )
    assert found.decision == "reconciled_sent"
    assert found.finish is not None
    assert found.finish.doubt is Doubt.RESOLVED
    assert found.finish.provider_message_id == "p-1"
    assert decide.in_doubt(_doubtful_claim(), channel, Lookup()).finish is None
    waiting = decide.in_doubt(_doubtful_claim(unsettled_until=80.0), channel, Lookup())
    assert waiting.decision == "wait_until_settled"
    assert waiting.finish is not None
    assert waiting.finish.run_at == 80.0
    failed = decide.in_doubt(_doubtful_claim(), channel, Lookup(error=OSError("down")))
    assert (failed.decision, failed.fields) == ("lookup_failed", {"error": "down"})
    assert failed.finish is not None
    assert failed.finish.job_status is JobStatus.RETRY_SCHEDULED


async def test_a_burst_worker_says_what_it_waits_for(make_app, clock) -> None:
    """While a retry is not due, a burst worker logs how many wait and when the first is
    due, and the job scheduled later that it does not wait for; at the end, what it
    leaves behind."""
    provider = FlakyProvider(script=["transient"], retry_after=40)
    app = await make_app(provider)
    await app.notify("e1", "u", "push", {}, send_after=timedelta(hours=1))
    await app.notify("e2", "u", "push", {})
    out = io.StringIO()
    configure(fmt="json", level="info", stream=out)
    try:
        settings = WorkerSettings(lease=10, poll_interval=0.01)
        worker = app.worker(settings=settings, worker_id="A")

        async def tick(_: float) -> None:  # the manual clock moves 5 s each time it waits
            clock.advance(5)

        clock.sleep = tick
        stats = await worker.run(burst=True)
    finally:
        configure(level="warning")
    assert stats.retries == 1
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    waiting = [line for line in lines if line["event"] == "burst_waiting"]
    assert waiting, [line["event"] for line in lines]
    first = waiting[0]
    assert (first["retries"], first["running"], first["later"]) == (1, 0, 1)
    assert first["next_retry_in_s"] == pytest.approx(40, abs=1)
    assert "1 retry (the first due at " in first["waiting_for"]
    assert ", in 40 s)" in first["waiting_for"]
    assert "1 job scheduled later, not waited for (the first at " in first["waiting_for"]
    assert len(waiting) < 8  # said when it changes, and every 15 s: not every poll
    (done,) = [line for line in lines if line["event"] == "burst_done"]
    assert done["later"] == 1
    assert done["left"].startswith("1 job scheduled later")


async def test_burst_ignores_later_schedules_but_waits_for_retries(make_app, clock) -> None:
    """A burst worker finishes retries it started and leaves send_after jobs for later."""
    provider = FlakyProvider(script=["transient"])
    app = await make_app(provider)
    later = await app.notify("e1", "u", "push", {}, send_after=timedelta(hours=1))
    now = await app.notify("e2", "u", "push", {})
    worker = app.worker(
        settings=WorkerSettings(lease=10, backoff_base=0.01, backoff_max=0.01, poll_interval=0.01),
        worker_id="A",
    )

    async def tick(_: float) -> None:  # the manual clock moves as the worker waits
        clock.advance(0.02)

    clock.sleep = tick
    stats = await worker.run(burst=True)
    assert stats.retries == 1
    assert provider.received(now.idempotency_key) == 2
    assert (await app.store.get_delivery(str(later.delivery_id))).status is DeliveryStatus.PENDING


def test_an_uncommitted_attempt_on_an_in_commit_channel_is_no_doubt_when_exhausted() -> None:
    """Attempts exhausted after an earlier one that never committed: held in doubt on
    a channel whose provider may have acted, failed on one whose effect is written in
    the finish's own commit (the inbox: ``in_commit``)."""
    from dataclasses import replace

    claim = _doubtful_claim()
    last = replace(claim, job=replace(claim.job, attempts=5))
    plain = Decisions(settings=SETTINGS, clock=ManualClock(), rng=random.Random(1))
    assert plain.retry(last, None, "not sent").delivery_status is DeliveryStatus.IN_DOUBT
    inbox = Decisions(
        settings=SETTINGS, clock=ManualClock(), rng=random.Random(1), in_commit=frozenset({"push"})
    )
    assert inbox.retry(last, None, "not sent").delivery_status is DeliveryStatus.FAILED


async def test_a_busy_burst_worker_reaps_at_the_reapers_cadence(make_app, clock) -> None:
    """A burst worker that claims work reaps every ``reap_every`` seconds, not before each
    claim; once it claims nothing it reaps, so a dead worker's expired lease is still
    delivered."""
    provider = FlakyProvider()
    app = await make_app(provider)
    sent = [await app.notify(f"e{i}", "u", "push", {}) for i in range(30)]
    [abandoned] = await app.store.claim(worker_id="dead", now=clock.now(), lease=10, limit=1)
    clock.advance(11)  # the dead worker's lease is over
    worker = app.worker(
        settings=WorkerSettings(lease=10, concurrency=5, batch_size=5, poll_interval=0.01),
        worker_id="B",
    )
    reaps = 0
    reap = worker.reap

    async def counted() -> int:
        nonlocal reaps
        reaps += 1
        return await reap()

    worker.reap = counted  # type: ignore[method-assign]
    stats = await worker.run(burst=True)
    assert stats.leases_expired == 1
    assert {provider.received(n.idempotency_key) for n in sent} == {1}
    assert abandoned.delivery.id in {n.delivery_id for n in sent}
    # the first round, then the round that claimed nothing (the lease reaped then),
    # then the last; not one per claim of 5
    assert reaps <= 3, reaps
