"""One conformance case per store operation, run on every driver (SQLite, PostgreSQL).

The model is River's ``riverdrivertest``: each operation of the store's protocol has a
case here named ``test_op_<operation>``, parametrized by ``database_url``
(tests/backends.py), and the last test fails when an operation has none. The drift
cases (``test_drift_*``) are the behaviours the two stores once disagreed on.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest

from kirim.engine import NotifyRequest
from kirim.errors import StoreError
from kirim.inbox import FeedAction, FeedFilter, FeedMark, FeedMessage
from kirim.keys import canonical_json, payload_hash
from kirim.model import AttemptStatus, CallbackStatus, DeliveryStatus, JobStatus
from kirim.notify.steps import Delay, Send
from kirim.preferences import Preferences
from kirim.runs import RunStatus, StepOutcome
from kirim.store import base, intake, open_store
from kirim.store.base import (
    SCHEMA_VERSION,
    AttemptOutcome,
    Callback,
    CallbackOutcome,
    Finish,
    Lease,
    RequestBegin,
    RequestState,
    StoredResponse,
)
from kirim.store.event_writes import CancelBy, EventWrite, Request, TopicBatch
from kirim.store.flows import NewRun
from kirim.store.sequence import Query
from kirim.testing import ManualClock
from notify_kit import intent_of

LEASE = 10.0


async def _one(app, event: str = "e", recipient: str = "u"):
    n = await app.notify(event, recipient, "push", {"e": event})
    return n.delivery_id


async def _claim(app, limit: int = 10):
    return await app.store.claim(worker_id="w1", now=app.clock.now(), lease=LEASE, limit=limit)


def _finish(c, now: float, *, status=DeliveryStatus.SENT, job=JobStatus.COMPLETED) -> Finish:
    return Finish(
        delivery_id=c.delivery.id,
        job_id=c.job.id,
        token=c.token,
        now=now,
        attempt=AttemptOutcome(
            provider_request_id=f"req-{c.delivery.id}",
            status=AttemptStatus.SUCCEEDED
            if status is DeliveryStatus.SENT
            else AttemptStatus.FAILED_PERMANENT,
            provider_message_id="p-1" if status is DeliveryStatus.SENT else None,
            error=None if status is DeliveryStatus.SENT else "no",
            completed_at=now,
        ),
        delivery_status=status,
        provider_message_id="p-1" if status is DeliveryStatus.SENT else None,
        job_status=job,
        run_at=None,
    )


async def _sent(app, event: str = "e") -> int:
    """A delivery taken through claim, intent and finish: sent, message id p-1."""
    delivery_id = await _one(app, event)
    (c,) = await _claim(app)
    assert await app.store.record_intents([intent_of(c, f"req-{c.delivery.id}")]) == [True]
    (done,) = await app.store.finish([_finish(c, app.clock.now())])
    assert done.committed
    return delivery_id


async def _dead(app) -> int:
    """A delivery whose job died (a permanent failure)."""
    delivery_id = await _one(app, "dead")
    (c,) = await _claim(app)
    await app.store.record_intents([intent_of(c, f"req-{c.delivery.id}")])
    await app.store.finish(
        [_finish(c, app.clock.now(), status=DeliveryStatus.FAILED, job=JobStatus.DEAD)]
    )
    return delivery_id


# -- lifecycle ------------------------------------------------------------------------


async def test_op_open(database_url) -> None:
    """Opening twice is one open, and a closed store can be opened again."""
    store = open_store(database_url)
    await store.open()
    await store.open()
    await store.close()
    await store.open()
    await store.close()


async def test_op_close(database_url) -> None:
    """Closing twice is harmless."""
    store = open_store(database_url)
    await store.open()
    await store.close()
    await store.close()


async def test_op_migrate(database_url) -> None:
    """migrate brings a fresh database to the current schema, and again changes nothing."""
    store = open_store(database_url)
    await store.open()
    try:
        assert await store.migrate() == SCHEMA_VERSION
        assert await store.migrate() == SCHEMA_VERSION
    finally:
        await store.close()


async def test_op_schema_version(database_url) -> None:
    """An empty database is at version 0, a migrated one at the current version."""
    store = open_store(database_url)
    await store.open()
    try:
        assert await store.schema_version() == 0
        await store.migrate()
        assert await store.schema_version() == SCHEMA_VERSION
    finally:
        await store.close()


async def test_op_check_schema(make_app) -> None:
    """A migrated database passes the schema check."""
    app = await make_app()
    await app.store.check_schema()


# -- queue ----------------------------------------------------------------------------


async def test_op_enqueue(make_app) -> None:
    """A new key creates a delivery and its queued job; the same key again finds it."""
    app = await make_app()
    first = await app.notify("e", "u", "push", {"a": 1})
    again = await app.notify("e", "u", "push", {"a": 1})
    assert first.created
    assert not again.created
    assert first.delivery_id == again.delivery_id
    assert (await app.store.counts())["jobs"] == {"queued": 1}


async def test_op_claim(make_app) -> None:
    """A due job is claimed once: its delivery is processing, its job's attempts grow."""
    app = await make_app()
    await _one(app)
    (c,) = await _claim(app)
    assert c.delivery.status is DeliveryStatus.PROCESSING
    assert c.job.attempts == 1
    assert await _claim(app) == []


async def test_op_heartbeat(make_app, clock) -> None:
    """A heartbeat keeps a lease held by its token and reports a stranger's as lost."""
    app = await make_app()
    await _one(app)
    (c,) = await _claim(app)
    leases = [
        Lease(delivery_id=c.delivery.id, job_id=c.job.id, token=c.token),
        Lease(delivery_id=c.delivery.id, job_id=c.job.id, token="x"),
    ]
    assert await app.store.heartbeat(leases, now=clock.now(), lease=LEASE) == [True, False]


async def test_op_record_intents(make_app) -> None:
    """An intent by the claim's holder is recorded, a second one for the same number not."""
    app = await make_app()
    await _one(app)
    (c,) = await _claim(app)
    assert await app.store.record_intents([intent_of(c, f"req-{c.delivery.id}")]) == [True]


async def test_op_not_found(make_app, clock) -> None:
    """An open request the provider said it does not have is recorded as not processed;
    one settled already never changes."""
    app = await make_app()
    await _one(app)
    (c,) = await _claim(app)
    assert await app.store.record_intents([intent_of(c, "req-open")]) == [True]
    await app.store.not_found(c.delivery.id, ["req-open", "req-none"], now=clock.now())
    (a,) = (await app.get(c.delivery.id)).attempts
    assert (a.provider_request_id, a.status) == ("req-open", AttemptStatus.FAILED_TRANSIENT)
    assert a.error is not None
    assert "not processed" in a.error
    sent = await _sent(app, "e2")
    before = (await app.get(sent)).attempts
    assert [x.status for x in before] == [AttemptStatus.SUCCEEDED]
    await app.store.not_found(sent, [x.provider_request_id for x in before], now=clock.now())
    assert (await app.get(sent)).attempts == before
    # what it records may say why it is known (an in-commit request never committed)
    await _one(app, "e3")
    (d,) = await _claim(app)
    assert await app.store.record_intents([intent_of(d, "req-unwritten")]) == [True]
    await app.store.not_found(d.delivery.id, ["req-unwritten"], now=clock.now(), error="why")
    (b,) = (await app.get(d.delivery.id)).attempts
    assert (b.status, b.error) == (AttemptStatus.FAILED_TRANSIENT, "why")


async def test_op_finish(make_app) -> None:
    """finish commits the outcome, the delivery's status and the job's together."""
    app = await make_app()
    delivery_id = await _sent(app)
    delivery = await app.store.get_delivery(str(delivery_id), by="id")
    assert delivery is not None
    assert delivery.status is DeliveryStatus.SENT
    assert (await app.store.counts())["jobs"] == {"completed": 1}


async def test_op_reap(make_app, clock) -> None:
    """An expired lease is reaped and its job can be claimed again."""
    app = await make_app()
    await _one(app)
    await _claim(app)
    clock.advance(LEASE + 1)
    assert [r.owner for r in await app.store.reap(now=clock.now())] == ["w1"]
    assert len(await _claim(app)) == 1


async def test_op_release(make_app, clock) -> None:
    """A released lease hands its job back at once."""
    app = await make_app()
    await _one(app)
    (c,) = await _claim(app)
    await app.store.release(
        [Lease(delivery_id=c.delivery.id, job_id=c.job.id, token=c.token)], now=clock.now()
    )
    assert len(await _claim(app)) == 1


async def test_op_next_run_at(make_app, clock) -> None:
    """next_run_at is the earliest due time of a waiting job, None with none."""
    app = await make_app()
    assert await app.store.next_run_at() is None
    await app.notify("e", "u", "push", {}, send_after=clock.now() + 60)
    assert await app.store.next_run_at() == clock.now() + 60


async def test_op_next_due_in(make_app, clock) -> None:
    """next_due_in is how long until the earliest waiting job is due."""
    app = await make_app()
    assert await app.store.next_due_in(now=clock.now()) is None
    await app.notify("e", "u", "push", {}, send_after=clock.now() + 60)
    assert await app.store.next_due_in(now=clock.now()) == pytest.approx(60)


async def test_op_in_flight(make_app) -> None:
    """in_flight counts the running jobs."""
    app = await make_app()
    await _one(app)
    assert await app.store.in_flight() == 0
    await _claim(app)
    assert await app.store.in_flight() == 1


async def test_op_waiting(make_app, clock) -> None:
    """waiting counts the queued jobs."""
    app = await make_app()
    await app.notify("e", "u", "push", {}, send_after=clock.now() + 60)
    waiting = await app.store.waiting(now=clock.now())
    assert waiting.later == 1
    assert waiting.next_later_at == clock.now() + 60


async def test_op_queue_stats(make_app, clock) -> None:
    """queue_stats counts the due jobs."""
    app = await make_app()
    await _one(app)
    stats = await app.store.queue_stats(now=clock.now())
    assert stats.queue_depth == 1


async def test_op_retire_address(make_app, clock) -> None:
    """Retiring an address marks every recipient's row of it."""
    app = await make_app()
    await app.store.add_address("u1", "push", "tok-1", label=None, now=clock.now())
    await app.store.add_address("u2", "push", "tok-1", label=None, now=clock.now())
    assert await app.store.retire_address("push", "tok-1", reason="gone", now=clock.now()) == 2
    assert await app.store.retired_addresses() == {"push": 2}


# -- operator reads and verbs -----------------------------------------------------------


async def test_op_get_delivery(make_app) -> None:
    """A delivery is found by its key or its id."""
    app = await make_app()
    delivery_id = await _one(app)
    by_id = await app.store.get_delivery(str(delivery_id), by="id")
    assert by_id is not None
    assert await app.store.get_delivery(by_id.idempotency_key, by="key") == by_id
    assert await app.store.get_delivery("nope") is None


async def test_op_get_job(make_app) -> None:
    """A delivery's latest job is found by the delivery's id."""
    app = await make_app()
    delivery_id = await _one(app)
    job = await app.store.get_job(delivery_id)
    assert job is not None
    assert job.status is JobStatus.QUEUED
    assert await app.store.get_job(delivery_id + 1000) is None


async def test_op_record(make_app) -> None:
    """A delivery's record: the delivery, its latest job and its attempts, by id or key."""
    app = await make_app()
    delivery_id = await _sent(app)
    record = await app.store.record(delivery_id, by="id")
    assert record is not None
    assert record.delivery.id == delivery_id
    assert record.job is not None
    assert record.job.status is JobStatus.COMPLETED
    (attempt,) = record.attempts
    assert attempt.status is AttemptStatus.SUCCEEDED
    assert await app.store.record(record.delivery.idempotency_key, by="key") == record
    assert await app.store.record("nope") is None


async def test_op_ping(make_app) -> None:
    """An open store answers a ping; a closed one raises StoreError."""
    app = await make_app()
    await app.store.ping()
    store = open_store(app.store.url)
    with pytest.raises(StoreError):
        await store.ping()


async def test_op_records(make_app) -> None:
    """A page of records: each delivery with its job and attempts."""
    app = await make_app()
    delivery_id = await _sent(app)
    (record,) = await app.store.records(base.RecordFilter())
    assert record.delivery.id == delivery_id
    assert record.job is not None
    assert len(record.attempts) == 1


async def test_op_attempts_of_many(make_app) -> None:
    """Attempts of several deliveries, by delivery."""
    app = await make_app()
    delivery_id = await _sent(app)
    found = await app.store.attempts_of_many([delivery_id, delivery_id + 99])
    assert len(found[delivery_id]) == 1
    assert found.get(delivery_id + 99, []) == []


async def test_op_dead_letters(make_app) -> None:
    """A delivery whose job died is a dead letter."""
    app = await make_app()
    delivery_id = await _dead(app)
    assert [d.delivery.id for d in await app.store.dead_letters()] == [delivery_id]


async def test_op_retry_dead(make_app, clock) -> None:
    """A dead letter retried is queued again."""
    app = await make_app()
    delivery_id = await _dead(app)
    assert await app.store.retry_dead(delivery_id, now=clock.now())
    assert await app.store.dead_letters() == []


async def test_op_reconcile(make_app, clock) -> None:
    """Reconciling a delivery that is not in doubt changes nothing."""
    app = await make_app()
    delivery_id = await _sent(app)
    done = await app.store.reconcile(
        delivery_id, now=clock.now(), found=True, message_id="p-1", seen=0
    )
    assert done is False


async def test_op_cancel(make_app, clock) -> None:
    """A pending delivery can be canceled, once."""
    app = await make_app()
    delivery_id = await _one(app)
    assert await app.store.cancel(delivery_id, now=clock.now())
    assert not await app.store.cancel(delivery_id, now=clock.now())


async def test_op_confirm(make_app, clock) -> None:
    """A callback for an unknown message id is unknown; for a sent one, repeated."""
    app = await make_app()
    await _sent(app)
    unknown = Callback(
        channel="push", message_id="zz", status=CallbackStatus.DELIVERED, now=clock.now()
    )
    assert (await app.store.confirm(unknown)).outcome is CallbackOutcome.UNKNOWN
    known = Callback(
        channel="push", message_id="p-1", status=CallbackStatus.DELIVERED, now=clock.now()
    )
    assert (await app.store.confirm(known)).outcome is not CallbackOutcome.UNKNOWN


async def test_op_apply_kept_callbacks(make_app, clock) -> None:
    """With no kept callback, there is nothing to apply."""
    app = await make_app()
    assert await app.store.apply_kept_callbacks(now=clock.now()) == []


async def test_op_counts(make_app) -> None:
    """Counts of deliveries and jobs by status."""
    app = await make_app()
    await _one(app)
    assert await app.store.counts() == {"deliveries": {"pending": 1}, "jobs": {"queued": 1}}


async def test_op_search_deliveries(make_app) -> None:
    """Search finds a delivery by its id or by text of its key."""
    app = await make_app()
    delivery_id = await _one(app, "needle")
    assert [d.id for d in await app.store.search_deliveries(str(delivery_id))] == [delivery_id]
    assert [d.id for d in await app.store.search_deliveries("needle")] == [delivery_id]


async def test_op_figures(make_app) -> None:
    """figures gives rows of plain values."""
    app = await make_app()
    await _sent(app)
    assert all(isinstance(r, dict) for r in await app.store.figures())


async def test_op_activity(make_app, clock) -> None:
    """A sent delivery is counted in the bucket of its time."""
    app = await make_app()
    await _sent(app)
    t = clock.now()
    found = await app.store.activity(since=t - 60, until=t + 60, bucket=60)
    assert sum(b.sent for b in found) == 1
    assert len(found) == 2


# -- tokens ---------------------------------------------------------------------------


async def test_op_create_token(make_app, clock) -> None:
    """A token is created once per name."""
    app = await make_app()
    made = await app.store.create_token("ci", "h1", prefix="kr_", now=clock.now())
    assert made is not None
    assert made.name == "ci"
    assert await app.store.create_token("ci", "h2", prefix="kr_", now=clock.now()) is None


async def test_op_verify_token(make_app, clock) -> None:
    """A token is found by its hash until it is revoked."""
    app = await make_app()
    await app.store.create_token("ci", "h1", prefix="kr_", now=clock.now())
    assert (await app.store.verify_token("h1")) is not None
    assert await app.store.verify_token("h2") is None


async def test_op_revoke_token(make_app, clock) -> None:
    """A token is revoked by name or by id."""
    app = await make_app()
    made = await app.store.create_token("ci", "h1", prefix="kr_", now=clock.now())
    assert made is not None
    revoked = await app.store.revoke_token(str(made.id), now=clock.now())
    assert revoked is not None
    assert revoked.revoked_at is not None
    assert await app.store.verify_token("h1") is None


async def test_op_list_tokens(make_app, clock) -> None:
    """Revoked tokens are listed only when asked for."""
    app = await make_app()
    await app.store.create_token("a", "h1", prefix="kr_", now=clock.now())
    await app.store.create_token("b", "h2", prefix="kr_", now=clock.now())
    await app.store.revoke_token("b", now=clock.now())
    assert [t.name for t in await app.store.list_tokens()] == ["a"]
    assert len(await app.store.list_tokens(include_revoked=True)) == 2


# -- intake of the HTTP service -------------------------------------------------------


async def test_op_handle_requests(make_app, clock) -> None:
    """A key is taken once; another request for it finds it in progress."""
    app = await make_app()
    begin = [RequestBegin(idempotency_key="k", fingerprint="f", lock_token="t1")]
    slots, done = await app.store.handle_requests(
        begin, [], now=clock.now(), hold=30, respond=lambda r: None
    )
    assert [s.state for s in slots] == [RequestState.ACQUIRED]
    assert done == []
    again = [RequestBegin(idempotency_key="k", fingerprint="f", lock_token="t2")]
    slots, _ = await app.store.handle_requests(
        again, [], now=clock.now(), hold=30, respond=lambda r: None
    )
    assert [s.state for s in slots] == [RequestState.IN_PROGRESS]


async def test_op_enqueue_request(make_app, clock) -> None:
    """A request's deliveries are recorded and its response kept for the key."""
    app = await make_app()
    begin = [RequestBegin(idempotency_key="k", fingerprint="f", lock_token="t1")]
    await app.store.handle_requests(begin, [], now=clock.now(), hold=30, respond=lambda r: None)
    items = [app.prepare(NotifyRequest(event_id="e", recipient="u", channel="push", payload={}))]
    results = await app.store.enqueue_request(
        items,
        key="k",
        token="t1",
        now=clock.now(),
        respond=lambda r: StoredResponse(status_code=201, body="{}"),
    )
    assert [r.created for r in results] == [True]
    slots, _ = await app.store.handle_requests(
        begin, [], now=clock.now(), hold=30, respond=lambda r: None
    )
    assert slots[0].state is RequestState.COMPLETED
    assert slots[0].status_code == 201


# -- recipients -----------------------------------------------------------------------


async def test_op_set_preferences(make_app, clock) -> None:
    """Preferences set are read back."""
    app = await make_app()
    prefs = Preferences(recipient_id="u1", opt_out=True)
    await app.store.set_preferences(prefs, now=clock.now())
    got = await app.store.get_preferences("u1")
    assert got is not None
    assert got.opt_out


async def test_op_get_preferences(make_app) -> None:
    """A recipient without preferences has none."""
    app = await make_app()
    assert await app.store.get_preferences("nobody") is None


async def test_op_preferences_of(make_app, clock) -> None:
    """Preferences of several recipients, by recipient."""
    app = await make_app()
    await app.store.set_preferences(Preferences(recipient_id="u1"), now=clock.now())
    assert list(await app.store.preferences_of(["u1", "u2"])) == ["u1"]


async def test_op_delete_preferences(make_app, clock) -> None:
    """Deleting preferences says whether there were any."""
    app = await make_app()
    await app.store.set_preferences(Preferences(recipient_id="u1"), now=clock.now())
    assert await app.store.delete_preferences("u1")
    assert not await app.store.delete_preferences("u1")


# -- addresses ------------------------------------------------------------------------


async def test_op_add_address(make_app, clock) -> None:
    """An address added is listed."""
    app = await make_app()
    added = await app.store.add_address("u1", "push", "tok", label="phone", now=clock.now())
    assert added.address == "tok"
    assert [a.address for a in await app.store.list_addresses("u1")] == ["tok"]


async def test_op_addresses_of(make_app, clock) -> None:
    """Addresses of several recipients, by recipient."""
    app = await make_app()
    await app.store.add_address("u1", "push", "tok", label=None, now=clock.now())
    found = await app.store.addresses_of(["u1", "u2"])
    assert [a.address for a in found["u1"]] == ["tok"]
    assert not found.get("u2")


async def test_op_list_addresses(make_app) -> None:
    """A recipient without addresses lists none."""
    app = await make_app()
    assert await app.store.list_addresses("u1") == []


async def test_op_remove_address(make_app, clock) -> None:
    """Removing an address says whether there was one."""
    app = await make_app()
    await app.store.add_address("u1", "push", "tok", label=None, now=clock.now())
    assert await app.store.remove_address("u1", "push", "tok")
    assert not await app.store.remove_address("u1", "push", "tok")


async def test_op_retired_addresses(make_app) -> None:
    """With nothing retired, no channel has retired addresses."""
    app = await make_app()
    assert await app.store.retired_addresses() == {}


# -- notification layer and retention -------------------------------------------------


async def test_op_take_rate_slot(make_app, clock) -> None:
    """The first slot of a channel is at once, the next one a period later."""
    app = await make_app()
    first = await app.store.take_rate_slot("push", 1.0, now=clock.now())
    second = await app.store.take_rate_slot("push", 1.0, now=clock.now())
    assert first == 0.0
    assert second == pytest.approx(1.0)


async def test_op_seal_digest(make_app, clock) -> None:
    """Sealing a delivery that is no digest's under a stranger's token gives nothing."""
    app = await make_app()
    delivery_id = await _one(app)
    assert await app.store.seal_digest(delivery_id, "x", now=clock.now(), compose=None) is None


async def test_op_prune(make_app, clock) -> None:
    """A settled delivery older than the retention is pruned, its key kept."""
    app = await make_app()
    await _sent(app)
    await _sent(app, "newest")  # the rows with the newest ids always stay
    clock.advance(100)
    result = await app.store.prune(now=clock.now(), keep=10, keys=1000)
    assert result.deliveries == 1
    assert (await app.notify("e", "u", "push", {"e": "e"})).created is False


async def test_op_import_keys(make_app, clock) -> None:
    """Imported keys are refused as new notifications afterwards."""
    app = await make_app()
    result = await app.store.import_keys(["k1"], now=clock.now())
    assert result.imported == 1
    again = await app.store.import_keys(["k1"], now=clock.now())
    assert again.imported == 0


# -- recipients' feeds, the in-app inbox ------------------------------------------------


async def _fed(app, event: str = "e", recipient: str = "u") -> int:
    """A delivery sent with a feed message in its finish: the feed item's id."""
    delivery_id = await _one(app, event, recipient)
    (c,) = await _claim(app)
    assert await app.store.record_intents([intent_of(c, f"req-{c.delivery.id}")]) == [True]
    message = FeedMessage(
        recipient_id=recipient,
        idempotency_key=c.delivery.idempotency_key,
        delivery_id=delivery_id,
        type=None,
        title=f"t-{event}",
        body="b",
        action_url=None,
        data={"n": 1},
    )
    finish = replace(_finish(c, app.clock.now()), feed=message)
    (done,) = await app.store.finish([finish])
    assert done.committed
    assert done.feed_item is not None
    return done.feed_item


async def test_op_feed_page(make_app) -> None:
    """A feed pages newest first with a cursor, and only the recipient's messages."""
    app = await make_app()
    first = await _fed(app, "a")
    second = await _fed(app, "b")
    await _fed(app, "c", recipient="other")
    page = await app.store.feed_page("u", FeedFilter.INBOX, 1, None)
    assert [i.id for i in page.items] == [second]
    assert page.next_before == second
    assert (page.counts.unseen, page.counts.unread) == (2, 2)
    rest = await app.store.feed_page("u", FeedFilter.INBOX, 1, page.next_before)
    assert [i.id for i in rest.items] == [first]
    assert rest.items[0].data == {"n": 1}


async def test_op_feed_counts(make_app, clock) -> None:
    """The counts are the recipient's messages not seen and not read."""
    app = await make_app()
    item = await _fed(app)
    await _fed(app, "b")
    await app.store.feed_action("u", item, FeedAction.READ, now=clock.now())
    counts = await app.store.feed_counts("u")
    assert (counts.unseen, counts.unread) == (1, 1)
    assert (await app.store.feed_counts("nobody")).unread == 0


async def test_op_feed_action(make_app, clock) -> None:
    """An action sets its mark once (again: unchanged); another recipient's is none."""
    app = await make_app()
    item = await _fed(app)
    done = await app.store.feed_action("u", item, FeedAction.SEEN, now=clock.now())
    assert done is not None
    assert done[0].seen_at == clock.now()
    assert done[1] is True
    clock.advance(5)
    again = await app.store.feed_action("u", item, FeedAction.SEEN, now=clock.now())
    assert again is not None
    assert again[1] is False
    assert again[0].seen_at == clock.now() - 5
    assert await app.store.feed_action("other", item, FeedAction.SEEN, now=clock.now()) is None


async def test_op_mark_feed(make_app, clock) -> None:
    """A bulk mark sets the mark on the messages named (None: all), counting changes."""
    app = await make_app()
    first = await _fed(app, "a")
    await _fed(app, "b")
    assert await app.store.mark_feed("u", [first], FeedMark.READ, now=clock.now()) == 1
    assert await app.store.mark_feed("u", None, FeedMark.READ, now=clock.now()) == 1
    assert await app.store.mark_feed("u", None, FeedMark.READ, now=clock.now()) == 0
    assert (await app.store.feed_counts("u")).unread == 0


async def test_op_delete_feed_item(make_app, clock) -> None:
    """A deleted message leaves the feed; deleting it again, or another's, is False."""
    app = await make_app()
    item = await _fed(app)
    assert await app.store.delete_feed_item("other", item, now=clock.now()) is False
    assert await app.store.delete_feed_item("u", item, now=clock.now()) is True
    assert await app.store.delete_feed_item("u", item, now=clock.now()) is False
    assert (await app.store.feed_page("u", FeedFilter.ALL, 10, None)).items == []


async def test_op_feed_changes(make_app, clock) -> None:
    """The changes after a number come oldest first, each with the item as it is now."""
    app = await make_app()
    item = await _fed(app)
    start = await app.store.feed_head("u")
    await app.store.feed_action("u", item, FeedAction.READ, now=clock.now())
    changes = await app.store.feed_changes("u", start, 10)
    assert [(c.kind, c.item_id) for c in changes.changes] == [("state", item)]
    assert changes.changes[0].item is not None
    assert changes.changes[0].item.read_at == clock.now()
    assert changes.last > start
    assert changes.more is False
    everything = await app.store.feed_changes("u", 0, 10)
    assert [(c.kind, c.item_id) for c in everything.changes] == [("message", item)]


async def test_op_feed_head(make_app, clock) -> None:
    """A feed's head is 0 before any write and grows with each of its writes only."""
    app = await make_app()
    assert await app.store.feed_head("u") == 0
    item = await _fed(app)
    head = await app.store.feed_head("u")
    assert head > 0
    await _fed(app, "b", recipient="other")
    assert await app.store.feed_head("u") == head
    await app.store.feed_action("u", item, FeedAction.ARCHIVE, now=clock.now())
    assert await app.store.feed_head("u") > head


async def test_op_feed_last_number(make_app) -> None:
    """The last number given to any feed write is every feed's newest head."""
    app = await make_app()
    assert await app.store.feed_last_number() == 0
    await _fed(app)
    await _fed(app, "b", recipient="other")
    assert await app.store.feed_last_number() == await app.store.feed_head("other")
    assert await app.store.feed_last_number() > await app.store.feed_head("u")


# -- drift the two stores once had --------------------------------------------------


@pytest.mark.parametrize("text", ["١", "٠", "0", "²"])
async def test_drift_ids_are_ascii_digits_from_one(make_app, clock, text) -> None:
    """An id is ASCII digits from 1: "١" (Arabic-Indic one) or "0" names nothing."""
    app = await make_app()
    await _one(app)
    made = await app.store.create_token("ci", "h1", prefix="kr_", now=clock.now())
    assert made is not None
    assert made.id == 1
    assert await app.store.get_delivery(text, by="id") is None
    assert await app.store.search_deliveries(text) == []
    assert await app.store.revoke_token(text, now=clock.now()) is None


async def test_drift_text_with_nul_finds_nothing(make_app, clock) -> None:
    """A text with NUL (which no stored text holds) finds nothing and changes nothing."""
    app = await make_app()
    await _one(app)
    nul = "u\x00"
    assert await app.store.get_delivery(nul) is None
    assert await app.store.search_deliveries(nul) == []
    assert await app.store.verify_token(nul) is None
    assert await app.store.revoke_token(nul, now=clock.now()) is None
    assert await app.store.get_preferences(nul) is None
    assert await app.store.preferences_of([nul]) == {}
    assert not await app.store.delete_preferences(nul)
    assert await app.store.list_addresses(nul) == []
    assert not (await app.store.addresses_of([nul])).get(nul)
    assert not await app.store.remove_address(nul, "push", nul)
    assert await app.store.retire_address("push", nul, reason="x", now=clock.now()) == 0


async def test_drift_a_negative_limit_means_no_limit(make_app, clock) -> None:
    """A negative limit is no limit, on every read and on a claim."""
    app = await make_app()
    for i in range(3):
        await _one(app, f"e{i}")
    assert len(await app.store.search_deliveries("e0", limit=-1)) == 1
    assert len(await app.store.records(base.RecordFilter(), limit=-1)) == 3
    assert len(await _claim(app, limit=-1)) == 3
    assert await app.store.dead_letters(limit=-1) == []
    assert await app.store.apply_kept_callbacks(now=clock.now(), limit=-1) == []


async def test_drift_empty_batches_are_answered_without_a_transaction(database_url) -> None:
    """An empty batch has an empty answer at once, even on a store opened read-only."""
    writer = open_store(database_url)
    await writer.open()
    await writer.migrate()
    await writer.close()
    store = open_store(database_url, read_only=True)
    await store.open()
    try:
        assert await store.claim(worker_id="w", now=0, lease=1, limit=0) == []
        assert await store.heartbeat([], now=0, lease=1) == []
        assert await store.record_intents([]) == []
        assert await store.finish([]) == []
        await store.release([], now=0)
        assert await store.enqueue([], now=0) == []
        assert await store.handle_requests([], [], now=0, hold=1, respond=lambda r: None) == (
            [],
            [],
        )
        assert await store.preferences_of([]) == {}
        assert await store.addresses_of([]) == {}
        assert await store.attempts_of_many([]) == {}
    finally:
        await store.close()


async def test_drift_time_of_record_is_the_stores_for_tokens(database_url) -> None:
    """On a store with a clock of its own, a token's times are that clock's, not the
    caller's ``now``."""
    clock = ManualClock(start=5000.0)
    store = open_store(database_url, time=clock)
    await store.open()
    try:
        await store.migrate()
        made = await store.create_token("ci", "h1", prefix="kr_", now=1.0)
        assert made is not None
        assert made.created_at == 5000.0
        revoked = await store.revoke_token("ci", now=1.0)
        assert revoked is not None
        assert revoked.revoked_at == 5000.0
    finally:
        await store.close()


def _expiring_tombstones(op):
    """``op``, with every tombstone deleted just before it reads the tombstones: the
    interleaving of a prune that expires them between two of its statements."""
    answer = None
    try:
        while True:
            step = op.send(answer)
            if isinstance(step, Query) and step.name == "tombstones_by_hashes":
                yield Query("prune_expire_tombstones", {"before": 1e18, "limit": 100}, count=True)
            answer = yield step
    except StopIteration as done:
        return done.value


async def test_drift_a_tombstone_that_vanishes_during_enqueue_is_a_store_error(
    make_app, clock
) -> None:
    """A key whose tombstone expires between the enqueue's statements is a StoreError
    (try again), on every driver."""
    app = await make_app()
    assert (await app.store.import_keys(["k1"], now=clock.now())).imported == 1
    item = app.prepare(
        NotifyRequest(event_id="e", recipient="u", channel="push", payload={}, key="k1")
    )
    with pytest.raises(StoreError, match="vanished during enqueue"):
        await app.store.driver.run(_expiring_tombstones(intake.enqueue([item], clock.now())))
    assert (await app.store.counts())["deliveries"] == {}  # rolled back


# -- topics ---------------------------------------------------------------------------


async def test_op_subscribe(make_app, clock) -> None:
    app = await make_app()
    first = await app.store.subscribe("t", "u", now=clock.now())
    again = await app.store.subscribe("t", "u", now=clock.now())
    assert first.created
    assert not again.created
    assert again.added_seq == first.added_seq


async def test_op_unsubscribe(make_app, clock) -> None:
    app = await make_app()
    await app.store.subscribe("t", "u", now=clock.now())
    assert await app.store.unsubscribe("t", "u", now=clock.now())
    assert not await app.store.unsubscribe("t", "u", now=clock.now())
    assert not await app.store.unsubscribe("t\x00", "u", now=clock.now())


async def test_op_topics_of(make_app, clock) -> None:
    app = await make_app()
    for topic in ("b", "a"):
        await app.store.subscribe(topic, "u", now=clock.now())
    assert await app.store.topics_of("u") == ["a", "b"]


async def test_op_subscribers(make_app, clock) -> None:
    app = await make_app()
    for r in ("u2", "U1", "u1"):
        await app.store.subscribe("t", r, now=clock.now())
    assert await app.store.subscribers("t") == ["U1", "u1", "u2"]  # bytewise, everywhere
    assert await app.store.subscribers("t", after="U1", limit=1) == ["u1"]


async def test_op_list_topics(make_app, clock) -> None:
    app = await make_app()
    await app.store.subscribe("t", "u", now=clock.now())
    (info,) = await app.store.list_topics()
    assert (info.topic, info.subscribers) == ("t", 1)


async def test_op_topic_info(make_app, clock) -> None:
    app = await make_app()
    assert await app.store.topic_info("t") is None
    await app.store.subscribe("t", "u", now=clock.now())
    await app.store.record_topic_event("t", "ty", "e", "{}", now=clock.now())
    info = await app.store.topic_info("t", recent=5)
    assert info is not None
    assert info.subscribers == 1
    assert len(info.recent) == 1


async def test_op_record_topic_event(make_app, clock) -> None:
    app = await make_app()
    sub = await app.store.subscribe("t", "u", now=clock.now())
    event = await app.store.record_topic_event("t", "ty", "e", "{}", now=clock.now())
    again = await app.store.record_topic_event("t", "ty", "e", "{}", now=clock.now())
    assert event.created
    assert not again.created
    assert event.mark == sub.added_seq + 1


async def test_op_claim_topic_event(make_app, clock) -> None:
    app = await make_app()
    await app.store.record_topic_event("t", "ty", "e", "{}", now=clock.now())
    got = await app.store.claim_topic_event(worker_id="w1", now=clock.now(), lease=LEASE)
    assert got is not None
    assert got.lease_owner == "w1"
    assert got.lease_token
    assert await app.store.claim_topic_event(worker_id="w2", now=clock.now(), lease=LEASE) is None
    clock.advance(LEASE + 1)
    taken = await app.store.claim_topic_event(worker_id="w2", now=clock.now(), lease=LEASE)
    assert taken is not None
    assert taken.lease_token != got.lease_token


async def test_op_topic_batch(make_app, clock) -> None:
    app = await make_app()
    await app.store.subscribe("t", "a", now=clock.now())
    await app.store.subscribe("t", "b", now=clock.now())
    event = await app.store.record_topic_event("t", "ty", "e", "{}", now=clock.now())
    await app.store.subscribe("t", "c", now=clock.now())  # after the mark
    await app.store.unsubscribe("t", "a", now=clock.now())  # after the mark: still in
    assert await app.store.topic_batch(event, limit=10) == ["a", "b"]
    assert await app.store.topic_batch(replace(event, cursor="a"), limit=10) == ["b"]


async def test_op_expand_topic_batch(make_app, clock) -> None:
    app = await make_app()
    await app.store.record_topic_event("t", "ty", "e", "{}", now=clock.now())
    got = await app.store.claim_topic_event(worker_id="w1", now=clock.now(), lease=LEASE)
    assert got is not None
    assert got.lease_token is not None
    item = app.prepare(NotifyRequest(event_id="e", recipient="a", channel="push", payload={}))
    args = {"last": True, "now": clock.now(), "lease": LEASE}
    batch = TopicBatch(deliveries=[item])
    wrong = await app.store.expand_topic_batch(got, "nope", ["a"], batch, **args)
    assert wrong is None
    assert (await app.store.counts())["deliveries"] == {}
    written = await app.store.expand_topic_batch(got, got.lease_token, ["a"], batch, **args)
    assert written is not None
    (done,) = written.deliveries
    assert done.created
    again = await app.store.expand_topic_batch(got, got.lease_token, ["a"], batch, **args)
    assert again is None  # the cursor moved on: the batch was done


async def test_op_topic_events_expanding(make_app, clock) -> None:
    app = await make_app()
    assert await app.store.topic_events_expanding() == 0
    await app.store.record_topic_event("t", "ty", "e", "{}", now=clock.now())
    assert await app.store.topic_events_expanding() == 1


async def test_op_latest_topic_events(make_app, clock) -> None:
    """The latest events of every topic, newest first, up to the limit."""
    app = await make_app()
    assert await app.store.latest_topic_events() == []
    for topic, event_id in (("t", "e1"), ("u", "e2"), ("t", "e3")):
        await app.store.record_topic_event(topic, "ty", event_id, "{}", now=clock.now())
    got = await app.store.latest_topic_events(limit=2)
    assert [(e.topic, e.event_id) for e in got] == [("t", "e3"), ("u", "e2")]


async def test_op_topic_counts(make_app, clock) -> None:
    """Topics, live subscriptions, and topic events pending (no batch yet), expanding
    (a batch done, more to come) and done."""
    app = await make_app()
    none = await app.store.topic_counts()
    assert (none.topics, none.subscriptions, none.pending, none.expanding, none.done) == (
        0, 0, 0, 0, 0,
    )  # fmt: skip
    for who in ("a", "b", "c"):
        await app.store.subscribe("t", who, now=clock.now())
    await app.store.unsubscribe("t", "c", now=clock.now())
    await app.store.subscribe("u", "a", now=clock.now())
    for event_id in ("e1", "e2", "e3"):
        await app.store.record_topic_event("t", "ty", event_id, "{}", now=clock.now())
    first = await app.store.claim_topic_event(worker_id="w1", now=clock.now(), lease=LEASE)
    assert first is not None
    assert first.lease_token is not None
    args = {"now": clock.now(), "lease": LEASE}
    none = TopicBatch()
    await app.store.expand_topic_batch(first, first.lease_token, ["a"], none, last=False, **args)
    second = await app.store.claim_topic_event(worker_id="w2", now=clock.now(), lease=LEASE)
    assert second is not None
    assert second.lease_token is not None
    assert second.id != first.id
    await app.store.expand_topic_batch(second, second.lease_token, ["a"], none, last=True, **args)
    got = await app.store.topic_counts()
    assert got.to_json() == {
        "topics": 2,
        "subscriptions": 3,
        "events": {"pending": 1, "expanding": 1, "done": 1},
    }


# -- workflow runs (kirim.store.flows) ------------------------------------------------


def _new_run(key: str = "r1", cancel_value: str | None = "o1") -> NewRun:
    steps = [Send(channel="push", name="push"), Delay(seconds=60, name="wait")]
    return NewRun(
        key=key,
        type="flow",
        event_id="e",
        recipient_id="u",
        steps_json=canonical_json([st.to_json() for st in steps]),
        data_json="{}",
        messages={"push": {"recipient": "u", "payload": "{}", "payload_hash": payload_hash("{}")}},
        max_attempts=3,
        cancel_value=cancel_value,
    )


async def _claimed_run(app):
    (started,) = await app.store.start_runs([_new_run()], now=app.clock.now())
    (claim,) = await app.store.claim_runs(worker_id="w1", now=app.clock.now(), lease=10, limit=5)
    return started.run, claim


async def test_op_start_runs(make_app) -> None:
    """A run is started once per key; the same key again returns it, not created."""
    app = await make_app()
    (first,) = await app.store.start_runs([_new_run()], now=app.clock.now())
    (again,) = await app.store.start_runs([_new_run()], now=app.clock.now())
    assert first.created
    assert not again.created
    assert again.run.id == first.run.id
    assert again.run.status is RunStatus.WAITING


async def test_op_claim_runs(make_app, clock) -> None:
    """A due run is claimed once until its lease expires; then again, with a new token."""
    app = await make_app()
    _run, claim = await _claimed_run(app)
    assert await app.store.claim_runs(worker_id="w2", now=clock.now(), lease=10, limit=5) == []
    clock.advance(11)
    (again,) = await app.store.claim_runs(worker_id="w2", now=clock.now(), lease=10, limit=5)
    assert again.token != claim.token
    assert again.run.claimed_by == "w2"


async def test_op_advance_run(make_app, clock) -> None:
    """The holder of the claim takes the send and delay steps, once; a stale token
    writes nothing."""
    app = await make_app()
    run, claim = await _claimed_run(app)
    assert await app.store.advance_run(run.id, "stale", now=clock.now()) is None
    done = await app.store.advance_run(run.id, claim.token, now=clock.now())
    assert done is not None
    assert [st.outcome for st in done.recorded] == [StepOutcome.SENT, StepOutcome.WAITED]
    assert done.run.next_at == clock.now() + 60
    assert await app.store.advance_run(run.id, claim.token, now=clock.now()) is None
    assert (await app.store.counts())["deliveries"] == {"pending": 1}


async def test_op_advance_runs(make_app, clock) -> None:
    """Each claimed run advanced, in one transaction; a stale token's answer is None
    and writes nothing; the answers in the order given."""
    app = await make_app()
    await app.store.start_runs([_new_run("a"), _new_run("b", "o2")], now=clock.now())
    claims = await app.store.claim_runs(worker_id="w1", now=clock.now(), lease=10, limit=5)
    pairs = [(c.run.id, c.token) for c in reversed(claims)] + [(claims[0].run.id, "stale")]
    done = await app.store.advance_runs(pairs, now=clock.now())
    assert [d is not None and d.run.id for d in done] == [c.run.id for c in reversed(claims)] + [
        False
    ]
    assert (await app.store.counts())["deliveries"] == {"pending": 2}
    assert await app.store.advance_runs([], now=clock.now()) == []


async def test_op_cancel_run(make_app, clock) -> None:
    """A run is canceled with its step's delivery not yet sent; once."""
    app = await make_app()
    run, claim = await _claimed_run(app)
    done = await app.store.advance_run(run.id, claim.token, now=clock.now())
    assert done is not None
    canceled = await app.store.cancel_run(run.id, why="test", now=clock.now())
    assert canceled is not None
    assert canceled.changed
    assert canceled.canceled == (done.recorded[0].delivery_id,)
    again = await app.store.cancel_run(run.id, why="test", now=clock.now())
    assert again is not None
    assert not again.changed
    assert await app.store.cancel_run(999, why="test", now=clock.now()) is None


async def test_op_runs_to_cancel(make_app, clock) -> None:
    """The waiting runs of a type with one cancellation value."""
    app = await make_app()
    await app.store.start_runs([_new_run("a"), _new_run("b", "o2")], now=clock.now())
    found = await app.store.runs_to_cancel("flow", "o1")
    assert len(found) == 1
    assert await app.store.runs_to_cancel("other", "o1") == []


async def test_op_record_event(make_app, clock) -> None:
    """An event's deliveries, the runs it cancels and its request's row, in one
    transaction: what ``refuse`` raises takes all of it back."""
    app = await make_app()
    (started,) = await app.store.start_runs([_new_run()], now=clock.now())
    items = [app.prepare(NotifyRequest(event_id="e", recipient="u", channel="push", payload={}))]
    cancels = [CancelBy(type="flow", key="order", value="o1", why="test")]

    def refuse(results) -> None:
        raise StoreError("refused")

    write = EventWrite(deliveries=items, cancels=cancels)
    with pytest.raises(StoreError):
        await app.store.record_event(write, now=clock.now(), refuse=refuse)
    assert (await app.store.get_run(started.run.id)).status is RunStatus.WAITING
    assert await app.store.counts() == {"deliveries": {}, "jobs": {}}
    begin = [RequestBegin(idempotency_key="k", fingerprint="f", lock_token="t1")]
    await app.store.handle_requests(begin, [], now=clock.now(), hold=30, respond=lambda r: None)

    def respond(w):
        return StoredResponse(status_code=201, body=str(len(w.canceled)))

    kept = Request(key="k", token="t1", respond=respond)
    done = await app.store.record_event(replace(write, request=kept), now=clock.now())
    assert [d.created for d in done.deliveries] == [True]
    assert [c.run.id for c in done.canceled] == [started.run.id]
    assert (await app.store.get_run(started.run.id)).status is RunStatus.CANCELED
    slots, _ = await app.store.handle_requests(
        begin, [], now=clock.now(), hold=30, respond=lambda r: None
    )
    assert (slots[0].state, slots[0].response) == (RequestState.COMPLETED, "1")
    again = await app.store.record_event(EventWrite(cancels=cancels), now=clock.now())
    assert again.canceled == ()


async def test_op_get_run(make_app, clock) -> None:
    """A run with its recorded steps and what their deliveries are now."""
    app = await make_app()
    run, claim = await _claimed_run(app)
    await app.store.advance_run(run.id, claim.token, now=clock.now())
    found = await app.store.get_run(run.id)
    assert found is not None
    assert found.recorded[0].delivery_status is DeliveryStatus.PENDING
    assert await app.store.get_run(999) is None


async def test_op_list_runs(make_app, clock) -> None:
    """The newest runs first, of one status or all."""
    app = await make_app()
    await app.store.start_runs([_new_run("a"), _new_run("b")], now=clock.now())
    listed = await app.store.list_runs()
    assert [r.key for r in listed] == ["b", "a"]
    assert await app.store.list_runs(status=RunStatus.DONE) == []


async def test_op_run_counts(make_app, clock) -> None:
    """Runs per status."""
    app = await make_app()
    await app.store.start_runs([_new_run("a"), _new_run("b")], now=clock.now())
    assert await app.store.run_counts() == {"waiting": 2}


# -- every operation has its case -----------------------------------------------------

#: every role the store's protocol is made of (new ones are found here by themselves)
_ROLES = [
    r for r in base.Store.__mro__ if r not in (base.Store, object) and r.__module__ != "typing"
]


def test_every_store_operation_has_a_conformance_case() -> None:
    """Each method of the store's roles has a ``test_op_<method>`` case in this module."""
    names = {
        name
        for role in _ROLES
        for name, _ in inspect.getmembers(role, inspect.isfunction)
        if not name.startswith("_")
    }
    missing = sorted(n for n in names if f"test_op_{n}" not in globals())
    assert missing == []
