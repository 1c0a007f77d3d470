"""The edges of the promise (findings D1–D4), on both backends.

Each test replays one path a careful reader found, step by step: two workers on one
database, time moved by hand, a provider whose requests live on the provider's side
(cancelling the caller does not stop them) and land when the test opens their gate.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backends import POOLED, backend_url
from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.errors import NotSettled, PermanentFailure, TransientFailure
from kirim.model import AttemptStatus, DeliveryStatus, Doubt, JobStatus, OnUnknown
from kirim.providers.base import Message, Sent
from kirim.testing import Checkpoints, FlakyProvider, GatedProvider, ManualClock
from kirim.worker import Worker, WorkerSettings

LEASE = 10.0
SETTINGS = WorkerSettings(lease=LEASE, backoff_base=1.0, backoff_max=1.0)


@pytest.fixture(params=POOLED)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database of each backend, and one reached through PgBouncer in
    transaction pooling mode: the worker's store calls keep nothing in a session."""
    return backend_url(request, tmp_path)


async def setup(make_app, provider, **kw):
    a = await make_app(provider, **kw)
    b = await make_app(provider, **kw)
    cp = Checkpoints()
    wa = a.worker(settings=SETTINGS, worker_id="A", checkpoints=cp)
    wb = b.worker(settings=SETTINGS, worker_id="B", checkpoints=cp)
    n = await a.notify("48291", "1007", "push", {"title": "Your order shipped"})
    return a, wa, wb, cp, n


async def settle_everything(app, worker, clock, rounds: int = 6) -> None:
    """Let time pass and run the worker until nothing is left to do."""
    for _ in range(rounds):
        clock.advance(4 * LEASE)
        await worker.run_once()


# -- D1: a committed intent is bounded in time ------------------------------------


async def test_d1_lookup_not_found_waits_for_a_slow_request(make_app, clock) -> None:
    """A's request is slow at the provider past A's lease; B's lookup says "not found";
    B must not send before A's request can no longer land."""
    provider = GatedProvider(idempotent=False, gated=1)
    app, wa, wb, _, n = await setup(make_app, provider, lookup=True)
    task_a = asyncio.create_task(wa.run_once())
    await provider.wait_requests(1)  # A's request left and is in flight
    clock.advance(LEASE + 1)
    await wb.run_once()  # B takes over; the provider does not know the key yet
    assert provider.effective(n.idempotency_key) == 0
    provider.open(0)  # A's request lands
    await task_a
    await settle_everything(app, wb, clock)
    delivery = (await app.get(n.delivery_id)).delivery
    assert provider.effective(n.idempotency_key) == 1
    assert delivery.status is DeliveryStatus.SENT


async def test_d1_a_paused_intent_is_not_sent_after_its_deadline(make_app, clock) -> None:
    """A commits its intent and pauses past its lease; B takes over (lookup: not found);
    A, resumed, must not send any more."""
    provider = FlakyProvider(idempotent=False)
    app, wa, wb, cp, n = await setup(make_app, provider, lookup=True)
    pause = cp.pause("before_provider_request", worker_id="A")
    task_a = asyncio.create_task(wa.run_once())
    await pause.reached()
    clock.advance(LEASE + 1)
    await wb.run_once()
    pause.release()
    await task_a
    await settle_everything(app, wb, clock)
    record = await app.get(n.delivery_id)
    delivery, attempts = record.delivery, record.attempts
    assert provider.effective(n.idempotency_key) == 1
    assert delivery.status is DeliveryStatus.SENT
    assert [a.worker_id for a in attempts if a.status is AttemptStatus.SUCCEEDED] == ["B"]


async def test_d1_skewed_reaper_does_not_revoke_a_live_lease(database_url) -> None:
    """B's clock runs 3 leases ahead of A's: B's reaper leaves A's live lease alone."""
    provider = FlakyProvider(idempotent=False)

    async def app() -> Kirim:
        channels = {"push": Channel(name="push", provider=provider, lookup=True)}
        kirim = Kirim(Config(database=database_url), channels=channels)
        return await kirim.open(migrate=True)

    a, b = await app(), await app()
    try:
        skewed = ManualClock()
        skewed.set(a.clock.now() + 3 * LEASE)
        wa = a.worker(settings=SETTINGS, worker_id="A")
        wb = Worker(b.store, b.channels(), settings=SETTINGS, worker_id="B", clock=skewed)
        await a.notify("e", "u", "push", {})
        assert await wa.claim_and_start() == 1
        assert await wb.reap() == 0  # A's lease is live in the database's time
        await wa.drain()
        assert await wb.run_once() == 0
        assert wa.stats.claims_lost == 0
        assert provider.effective(provider.requests[0].idempotency_key) == 1
    finally:
        await a.close()
        await b.close()


async def test_d1_operator_retry_waits_for_an_unsettled_request(make_app, clock) -> None:
    """A held delivery whose earlier request may still land cannot be retried yet."""
    provider = GatedProvider(idempotent=False, gated=1)
    app, wa, wb, _, n = await setup(make_app, provider, on_unknown=OnUnknown.HOLD)
    task_a = asyncio.create_task(wa.run_once())
    await provider.wait_requests(1)
    clock.advance(LEASE + 1)
    await wb.run_once()  # B takes over and holds: an earlier request may have arrived
    held = (await app.get(n.delivery_id)).delivery
    assert held.status is DeliveryStatus.IN_DOUBT
    with pytest.raises(NotSettled) as refused:
        await app.store.retry_dead(n.delivery_id, now=clock.now())
    assert refused.value.retry_at > clock.now()
    provider.open(0)
    await task_a
    await settle_everything(app, wb, clock)
    assert provider.effective(n.idempotency_key) == 1
    delivery = (await app.get(n.delivery_id)).delivery
    assert delivery.status is DeliveryStatus.SENT  # A's late success resolved the doubt


async def test_d1_cancel_waits_for_an_unsettled_request(make_app, clock) -> None:
    """A delivery with an intent that may still turn into a request is not canceled."""
    provider = FlakyProvider(idempotent=False, script=["accept_then_timeout"])
    app, wa, wb, cp, n = await setup(make_app, provider)
    pause = cp.pause("before_provider_request", worker_id="A")
    task_a = asyncio.create_task(wa.run_once())
    await pause.reached()
    clock.advance(LEASE + 1)
    await wb.reap()  # A's claim is revoked; its intent is committed
    with pytest.raises(NotSettled):
        await app.store.cancel(n.delivery_id, now=clock.now())
    pause.release()
    await task_a
    delivery = (await app.get(n.delivery_id)).delivery
    received = provider.effective(n.idempotency_key)
    assert not (delivery.status is DeliveryStatus.CANCELED and received > 0)
    assert received == 0  # A's deadline had passed: it sent nothing


async def test_d1_shutdown_release_does_not_lead_to_a_second_request(make_app, clock) -> None:
    """A worker stopped mid-request releases its lease; B takes over at once and must
    not send while A's request can still land."""
    provider = GatedProvider(idempotent=False, gated=1)
    app, _, wb, _, n = await setup(make_app, provider, lookup=True)
    wa = app.worker(settings=WorkerSettings(lease=LEASE, shutdown_grace=0.0), worker_id="A")
    run_a = asyncio.create_task(wa.run(burst=True))
    await provider.wait_requests(1)
    wa.stop()
    await run_a  # the in-flight call is cancelled and the lease released
    await wb.run_once()
    provider.open(0)  # the request that left before the shutdown lands
    await provider.drain()
    await settle_everything(app, wb, clock)
    assert provider.effective(n.idempotency_key) == 1


# -- D2: one bad row hurts only its own delivery ----------------------------------


class PoisonText(FlakyProvider):
    """Refuses the recipient "bad" with an answer text no database column takes."""

    async def send(self, message: Message) -> Sent:
        if message.recipient == "bad":
            self.requests.append(message)
            raise PermanentFailure("HTTP 400: \x00\ud800 broken", status_code=400)
        return await super().send(message)


async def test_d2_a_poisoned_outcome_does_not_fail_its_batch(make_app, clock) -> None:
    """An answer text with NUL and a lone surrogate is stored sanitised, and the delivery
    committed in the same batch keeps its success."""
    provider = PoisonText(idempotent=False)
    app = await make_app(provider)
    bad = await app.notify("e", "bad", "push", {})
    good = await app.notify("e", "good", "push", {})
    worker = app.worker(settings=SETTINGS, worker_id="A")
    await worker.run_once()
    record = await app.get(bad.delivery_id)
    b, battempts = record.delivery, record.attempts
    g = (await app.get(good.delivery_id)).delivery
    assert (g.status, g.doubt, g.provider_message_id) == (DeliveryStatus.SENT, None, "p-1001")
    assert b.status is DeliveryStatus.FAILED
    assert "broken" in b.last_error
    assert "\x00" not in b.last_error
    assert battempts[0].status is AttemptStatus.FAILED_PERMANENT


class FailingRows:
    """A store whose batches fail whenever they hold one given delivery."""

    def __init__(self, store, poisoned: int) -> None:
        self._store = store
        self.poisoned = poisoned
        self.batches: list[int] = []

    def __getattr__(self, name):
        return getattr(self._store, name)

    async def record_intents(self, intents):
        self.batches.append(len(intents))
        if any(it.delivery_id == self.poisoned for it in intents):
            from kirim.errors import StoreError

            raise StoreError("poisoned row (test)")
        return await self._store.record_intents(intents)


async def test_d2_a_failing_intent_row_does_not_block_the_others(make_app, clock) -> None:
    """An intent batch that fails is retried row by row; only the failing row's
    delivery is held back."""
    provider = FlakyProvider(idempotent=False)
    app = await make_app(provider)
    bad = await app.notify("e", "bad", "push", {})
    good = await app.notify("e", "good", "push", {})
    store = FailingRows(app.store, bad.delivery_id)
    worker = Worker(store, app.channels(), settings=SETTINGS, worker_id="A", clock=clock)
    await worker.run_once()
    assert max(store.batches) == 2  # both intents met in one batch
    assert provider.effective(good.idempotency_key) == 1
    assert provider.effective(bad.idempotency_key) == 0
    g = (await app.get(good.delivery_id)).delivery
    assert g.status is DeliveryStatus.SENT


# -- D3: unresolved doubt is never a plain failure --------------------------------


async def test_d3_lookup_error_on_the_last_attempt_is_in_doubt(make_app, clock) -> None:
    """The first request may have arrived; the lookup fails on the final attempt:
    the delivery is in doubt, not failed."""

    class BrokenLookup(FlakyProvider):
        async def lookup(self, idempotency_key: str) -> Sent | None:
            raise RuntimeError("lookup API down")

    provider = BrokenLookup(idempotent=False, script=["accept_then_timeout"])
    app = await make_app(provider, lookup=True, max_attempts=2)
    n = await app.notify("e", "u", "push", {})
    worker = app.worker(settings=SETTINGS, worker_id="A")
    await settle_everything(app, worker, clock)
    record = await app.get(n.delivery_id)
    delivery, job = record.delivery, record.job
    assert provider.effective(n.idempotency_key) == 1
    assert delivery.status is DeliveryStatus.IN_DOUBT
    assert job.status is JobStatus.DEAD


async def test_d3_refused_after_an_unknown_is_in_doubt(make_app, clock) -> None:
    """An unknown first request, then refusals until the attempts run out: in doubt."""
    provider = FlakyProvider(idempotent=True, script=["accept_then_timeout", "transient"])
    app = await make_app(provider, max_attempts=2)
    n = await app.notify("e", "u", "push", {})
    worker = app.worker(settings=SETTINGS, worker_id="A")
    await settle_everything(app, worker, clock)
    delivery = (await app.get(n.delivery_id)).delivery
    assert provider.effective(n.idempotency_key) == 1
    assert delivery.status is DeliveryStatus.IN_DOUBT


async def test_d3_unconfigured_channel_after_an_unknown_is_in_doubt(make_app, clock) -> None:
    """The last attempt lands on a worker without the channel; an earlier request may
    have arrived: in doubt, not failed."""
    provider = FlakyProvider(idempotent=True, script=["accept_then_timeout"])
    app = await make_app(provider, max_attempts=2)
    n = await app.notify("e", "u", "push", {})
    await app.worker(settings=SETTINGS, worker_id="A").run_once()
    other = Worker(app.store, {}, settings=SETTINGS, worker_id="B", clock=clock)
    await settle_everything(app, other, clock)
    delivery = (await app.get(n.delivery_id)).delivery
    assert provider.effective(n.idempotency_key) == 1
    assert delivery.status is DeliveryStatus.IN_DOUBT


# -- D4: a late definite non-delivery reopens an assumption ------------------------


@pytest.mark.parametrize("late", ["transient", "permanent"])
async def test_d4_late_definite_failure_reopens_assumed_sent(make_app, clock, late) -> None:
    """B assumed A's slow request was sent; it is then refused: the assumption is
    withdrawn (transient: sent again; permanent: failed)."""

    class LateRefusal(GatedProvider):
        async def effect(self, message: Message) -> Sent:
            if message is self.arrivals[0]:
                if late == "transient":
                    raise TransientFailure("HTTP 429 (test)", status_code=429)
                raise PermanentFailure("HTTP 400 (test)", status_code=400)
            return await super().effect(message)

    provider = LateRefusal(idempotent=False, gated=1)
    app, wa, wb, _, n = await setup(make_app, provider)
    task_a = asyncio.create_task(wa.run_once())
    await provider.wait_requests(1)
    clock.advance(LEASE + 1)
    await wb.run_once()
    assumed = (await app.get(n.delivery_id)).delivery
    assert (assumed.status, assumed.doubt) == (DeliveryStatus.SENT, Doubt.ASSUMED_SENT)
    provider.open(0)
    await task_a
    await settle_everything(app, wb, clock)
    delivery = (await app.get(n.delivery_id)).delivery
    if late == "transient":
        assert provider.effective(n.idempotency_key) == 1
        assert delivery.status is DeliveryStatus.SENT
    else:
        assert provider.effective(n.idempotency_key) == 0
        assert delivery.status is DeliveryStatus.FAILED


# -- the heartbeat's warning is kept for a real takeover ---------------------------


async def test_heartbeat_does_not_report_a_completed_job_as_taken_over(make_app, clock) -> None:
    """A lease that is gone because its job committed meanwhile is not a lost claim."""
    entered, gate = asyncio.Event(), asyncio.Event()

    class LateHeartbeat:
        """The store, with a heartbeat that reaches the database after the commit."""

        def __init__(self, store) -> None:
            self._store = store

        def __getattr__(self, name):
            return getattr(self._store, name)

        async def heartbeat(self, leases, *, now, lease):
            entered.set()
            await gate.wait()
            return await self._store.heartbeat(leases, now=now, lease=lease)

    app = await make_app(FlakyProvider(idempotent=False))
    await app.notify("e", "u", "push", {})
    cp = Checkpoints()
    store = LateHeartbeat(app.store)
    worker = Worker(
        store, app.channels(), settings=SETTINGS, worker_id="A", clock=clock, checkpoints=cp
    )
    pause = cp.pause("before_commit", worker_id="A")
    task = asyncio.create_task(worker.run_once())
    await pause.reached()
    beat = asyncio.create_task(worker.heartbeat())
    await entered.wait()  # the heartbeat took its snapshot of the leases
    pause.release()
    await task  # committed: the job's lease token is gone
    gate.set()
    assert await beat == []
    assert worker.stats.claims_lost == 0


async def test_api_answers_not_settled_with_409_and_retry_after() -> None:
    """The HTTP service turns NotSettled into 409 not_settled with a Retry-After."""
    import time

    import httpx
    from fastapi import FastAPI

    from kirim.http.errors import install

    api = FastAPI()
    install(api)

    @api.post("/x")
    async def refuse() -> None:
        raise NotSettled(7, retry_at=time.time() + 30, action="cancel")

    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        answer = await client.post("/x")
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "not_settled"
    assert 25 <= int(answer.headers["Retry-After"]) <= 31


# -- found by the explorer on the fixed code ---------------------------------------


async def test_a_refusal_after_an_unknown_request_is_in_doubt(make_app, clock) -> None:
    """An unknown first request, then a 400 for the resend: the first may have arrived,
    so the delivery is held in doubt, not failed."""
    provider = FlakyProvider(idempotent=True, script=["accept_then_timeout", "permanent"])
    app = await make_app(provider, max_attempts=3)
    n = await app.notify("e", "u", "push", {})
    await settle_everything(app, app.worker(settings=SETTINGS, worker_id="A"), clock)
    record = await app.get(n.delivery_id)
    delivery, job = record.delivery, record.job
    assert provider.effective(n.idempotency_key) == 1
    assert (delivery.status, delivery.doubt) == (DeliveryStatus.IN_DOUBT, Doubt.HELD)
    assert job.status is JobStatus.DEAD


async def test_cancel_after_an_unknown_request_keeps_the_doubt(make_app, clock) -> None:
    """Canceled once settled, a delivery whose request may have arrived stays in doubt."""
    provider = FlakyProvider(idempotent=True, script=["accept_then_timeout"])
    app = await make_app(provider)
    n = await app.notify("e", "u", "push", {})
    await app.worker(settings=SETTINGS, worker_id="A").run_once()  # unknown: retry later
    clock.advance(6 * LEASE)  # past settles_at: deadline + request timeout + margin
    assert await app.store.cancel(n.delivery_id, now=clock.now())
    delivery = (await app.get(n.delivery_id)).delivery
    assert provider.effective(n.idempotency_key) == 1
    assert (delivery.status, delivery.doubt) == (DeliveryStatus.CANCELED, Doubt.HELD)
    assert delivery.status_label == "canceled (held)"


async def test_due_time_is_measured_in_store_time(database_url) -> None:
    """A worker whose clock runs 20 s ahead of the database's reads how long until the
    next job is due in the database's time (it used to spin, comparing two clocks)."""
    from datetime import timedelta

    channels = {"push": Channel(name="push", provider=FlakyProvider())}
    app = await Kirim(Config(database=database_url), channels=channels).open(migrate=True)
    try:
        await app.notify("e", "u", "push", {}, send_after=timedelta(seconds=30))
        ahead = ManualClock()
        ahead.set(app.clock.now() + 20)
        worker = Worker(app.store, app.channels(), settings=SETTINGS, clock=ahead)
        due_in = await worker._next_due_in()
        assert due_in == pytest.approx(30, abs=5)
    finally:
        await app.close()
