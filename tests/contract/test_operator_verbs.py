"""The operator's verbs of the engine (``Kirim.get``, ``records``, ``dead_letters``,
``in_doubt``, ``cancel``, ``retry``), on both backends, with real outcomes from a
real worker: the CLI, the HTTP API and the dashboard only render what they return."""

from __future__ import annotations

import sqlite3

import pytest

from kirim.errors import ActionRefused, AmbiguousFailure, NotFound
from kirim.model import DeliveryStatus, Doubt, JobStatus, OnUnknown, RecordFilter
from kirim.testing import FlakyProvider
from kirim.worker import WorkerSettings

SETTINGS = WorkerSettings(lease=10, backoff_base=0.0, backoff_max=0.0, concurrency=1)


async def outcomes(make_app, clock):
    """Four deliveries, a minute apart: 0 sent, 1 failed for good (a dead letter), 2
    sent under assume_sent (its answer was lost, the provider keys nothing), 3 pending."""
    provider = FlakyProvider(idempotent=False, script=["ok", "permanent", "accept_then_timeout"])
    app = await make_app(provider, on_unknown=OnUnknown.ASSUME_SENT, max_attempts=3)
    made = []
    for i in range(3):
        made.append(await app.notify(f"e{i}", f"u{i}", "push", {"i": i}))
        await app.worker(settings=SETTINGS).run(burst=True)
        clock.advance(60)
    made.append(await app.notify("e3", "u3", "push", {"i": 3}, send_after=3600))
    return app, [n.delivery_id for n in made]


async def test_records_filter_and_page_both_ways(make_app, clock) -> None:
    app, ids = await outcomes(make_app, clock)
    everything = await app.records()
    assert [r.delivery.id for r in everything.records] == ids[::-1]  # newest first
    assert everything.next_cursor is None
    by_status = {r.delivery.id: r.delivery.status for r in everything.records}
    assert by_status == {
        ids[0]: DeliveryStatus.SENT,
        ids[1]: DeliveryStatus.FAILED,
        ids[2]: DeliveryStatus.SENT,
        ids[3]: DeliveryStatus.PENDING,
    }
    # each record carries its latest job and its attempts
    sent = next(r for r in everything.records if r.delivery.id == ids[0])
    assert sent.job is not None
    assert sent.job.status is JobStatus.COMPLETED
    assert [a.number for a in sent.attempts] == [1]
    pending = next(r for r in everything.records if r.delivery.id == ids[3])
    assert pending.attempts == []
    assert pending.job is not None
    assert pending.job.status is JobStatus.QUEUED

    first = await app.records(limit=3)
    assert [r.delivery.id for r in first.records] == ids[:0:-1]
    assert first.next_cursor == ids[1]
    rest = await app.records(cursor=first.next_cursor, limit=3)
    assert [r.delivery.id for r in rest.records] == [ids[0]]
    assert rest.next_cursor is None

    oldest = await app.records(RecordFilter(oldest_first=True), limit=2)
    assert [r.delivery.id for r in oldest.records] == ids[:2]
    assert oldest.next_cursor == ids[1]
    onward = await app.records(RecordFilter(oldest_first=True), cursor=ids[1], limit=2)
    assert [r.delivery.id for r in onward.records] == ids[2:]
    assert onward.next_cursor is None

    assumed = RecordFilter(status=DeliveryStatus.SENT, doubt=Doubt.ASSUMED_SENT)
    assert [r.delivery.id for r in (await app.records(assumed)).records] == [ids[2]]
    assert [r.delivery.id for r in (await app.records(RecordFilter(dead=True))).records] == [ids[1]]
    assert (await app.records(RecordFilter(channel="sms"))).records == []
    created = {r.delivery.id: r.delivery.created_at for r in everything.records}
    window = RecordFilter(since=created[ids[1]], until=created[ids[2]])  # until: exclusive
    assert [r.delivery.id for r in (await app.records(window)).records] == [ids[1]]


async def test_dead_letters_and_in_doubt(make_app, clock) -> None:
    app, ids = await outcomes(make_app, clock)
    dead = await app.dead_letters()
    assert [(r.delivery.id, r.job.status if r.job else None) for r in dead] == [
        (ids[1], JobStatus.DEAD)
    ]
    assert [a.status for a in dead[0].attempts] == ["failed_permanent"]
    assert await app.in_doubt() == []


async def test_held_doubt_is_listed_in_doubt(make_app, clock) -> None:
    provider = FlakyProvider(script=["accept_then_timeout"])
    app = await make_app(provider, on_unknown=OnUnknown.HOLD, max_attempts=1)
    n = await app.notify("e0", "u0", "push", {})
    await app.worker(settings=SETTINGS).run(burst=True)
    held = await app.in_doubt()
    assert [r.delivery.id for r in held] == [n.delivery_id]
    assert held[0].delivery.doubt is Doubt.HELD


async def test_get_by_id_never_takes_a_key_of_digits(make_app, clock) -> None:
    app = await make_app()
    first = await app.notify("e0", "u0", "push", {})
    second = await app.notify("e1", "u1", "push", {}, key=str(first.delivery_id))
    assert (await app.get(first.delivery_id)).delivery.id == first.delivery_id  # an int is an id
    assert (await app.get(str(first.delivery_id))).delivery.id == second.delivery_id  # the key
    assert (await app.get(str(first.delivery_id), by="id")).delivery.id == first.delivery_id
    assert await app.get(999_999, by="id") is None


async def test_cancel_and_retry_say_why_they_do_not_apply(make_app, clock) -> None:
    app, ids = await outcomes(make_app, clock)
    with pytest.raises(ActionRefused) as refused:
        await app.cancel(ids[0], by="id")  # sent
    assert refused.value.code == "not_cancelable"
    assert "it is sent" in str(refused.value)
    with pytest.raises(ActionRefused) as refused:
        await app.retry(ids[0], by="id")
    assert refused.value.code == "not_dead_lettered"
    assert "delivery sent, job completed" in str(refused.value)
    with pytest.raises(ActionRefused) as refused:
        await app.cancel(ids[3], by="id", dead_only=True)  # pending: not a dead letter
    assert refused.value.code == "not_dead_lettered"
    with pytest.raises(NotFound):
        await app.retry(999_999, by="id")

    canceled = await app.cancel(ids[3], by="id")
    assert canceled.delivery.status is DeliveryStatus.CANCELED
    retried = await app.retry(ids[1], by="id")
    assert retried.job is not None
    assert retried.job.status is JobStatus.QUEUED
    assert retried.delivery.status is DeliveryStatus.PENDING
    assert await app.dead_letters() == []


async def test_a_page_is_two_statements_not_one_per_delivery(make_app, clock, database_url) -> None:
    """SQLite shows every statement it runs: a page of 20 records is the page and the
    attempts of all of them (the old listing ran 1 + 2 per delivery)."""
    if not database_url.startswith("sqlite"):
        pytest.skip("statement tracing: SQLite's trace callback")
    app = await make_app()
    for i in range(20):
        await app.notify(f"e{i}", f"u{i}", "push", {})
    seen: list[str] = []
    conn: sqlite3.Connection = app.store.driver._conn  # the store's one connection
    await app.store.driver._call(lambda: conn.set_trace_callback(seen.append))
    page = await app.records(limit=20)
    await app.store.driver._call(lambda: conn.set_trace_callback(None))
    assert len(page.records) == 20
    statements = [s for s in seen if s.lstrip().upper().startswith("SELECT")]
    assert len(statements) == 2, seen


class Asked(FlakyProvider):
    """A provider that can be asked (``lookup``), and whose lookup can be down."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(idempotent=False, **kwargs)  # type: ignore[arg-type]
        self.down = False

    async def lookup(self, idempotency_key: str):  # type: ignore[no-untyped-def]
        if self.down:
            raise AmbiguousFailure("lookup: HTTP 503 (test)")
        return await super().lookup(idempotency_key)


async def held_while_lookup_was_down(make_app, clock, script):
    """A delivery held in doubt on a channel with lookup: its answer was lost, and the
    provider could not be asked before its attempts ran out."""
    provider = Asked(script=script)
    app = await make_app(provider, on_unknown=OnUnknown.HOLD, lookup=True, max_attempts=2)
    n = await app.notify("e", "u", "push", {})
    provider.down = True
    worker = app.worker(settings=SETTINGS)
    for _ in range(4):
        await worker.run_once()
        clock.advance(60)
    d = (await app.get(n.delivery_id)).delivery
    assert (d.status, d.doubt) == (DeliveryStatus.IN_DOUBT, Doubt.HELD)
    provider.down = False
    clock.advance(3600)  # every earlier request settled
    return app, provider, worker, n


async def test_a_retry_where_the_provider_can_be_asked_asks_before_sending(make_app, clock) -> None:
    """An operator retries a delivery held in doubt on a channel with lookup, once the
    lookup is back: the worker asks the provider first, finds the first copy, and
    sends nothing more (issue 20: on main the retry released the doubt and the user got
    a second copy)."""
    app, provider, worker, n = await held_while_lookup_was_down(
        make_app, clock, ["accept_then_timeout"]
    )
    assert app.second_copy_possible(await app.get(n.delivery_id)) is False
    await app.retry(n.delivery_id)
    await worker.run_once()
    d = (await app.get(n.delivery_id)).delivery
    assert (d.status, d.doubt) == (DeliveryStatus.SENT, Doubt.RESOLVED)
    assert provider.effective(n.idempotency_key) == 1
    assert provider.received(n.idempotency_key) == 1


@pytest.mark.parametrize("arrived", [True, False], ids=["found", "not-found"])
async def test_reconcile_settles_a_held_doubt_either_way(make_app, clock, arrived) -> None:
    """``reconcile`` asks the provider: found, sent (resolved, nothing more sent); not
    found, failed (resolved): a retry then sends it once, with no second copy possible."""
    script = ["accept_then_timeout"] if arrived else ["ambiguous"]
    app, provider, worker, n = await held_while_lookup_was_down(make_app, clock, script)
    record = await app.reconcile(n.delivery_id)
    if arrived:
        assert (record.delivery.status, record.delivery.doubt) == (
            DeliveryStatus.SENT,
            Doubt.RESOLVED,
        )
        assert record.job is not None
        assert record.job.status is JobStatus.COMPLETED
        assert await app.dead_letters() == []
        return
    assert (record.delivery.status, record.delivery.doubt) == (
        DeliveryStatus.FAILED,
        Doubt.RESOLVED,
    )
    assert {a.status.value for a in record.attempts} == {"failed_transient"}
    assert app.second_copy_possible(record) is False
    await app.retry(n.delivery_id)
    await worker.run_once()
    assert (await app.get(n.delivery_id)).delivery.status is DeliveryStatus.SENT
    assert provider.effective(n.idempotency_key) == 1


async def test_reconcile_finding_nothing_sends_an_assumption_on_while_attempts_are_left(
    make_app, clock
) -> None:
    """Sent under an assumption (its answer lost; the channel had no lookup then), with
    attempts left: the provider, asked once it can be, has nothing. The delivery goes
    back to the queue, not to the dead letters: the worker sends it, once (on main it was
    failed, its attempts left unused)."""
    provider = Asked(script=["ambiguous"])
    before = await make_app(provider, on_unknown=OnUnknown.ASSUME_SENT, max_attempts=3)
    n = await before.notify("e", "u", "push", {})
    await before.worker(settings=SETTINGS).run_once()
    app = await make_app(provider, on_unknown=OnUnknown.ASSUME_SENT, lookup=True, max_attempts=3)
    worker = app.worker(settings=SETTINGS)
    assumed = (await app.get(n.delivery_id)).delivery
    assert (assumed.status, assumed.doubt) == (DeliveryStatus.SENT, Doubt.ASSUMED_SENT)
    clock.advance(3600)  # every earlier request settled
    record = await app.reconcile(n.delivery_id)
    assert (record.delivery.status, record.delivery.doubt) == (DeliveryStatus.PENDING, None)
    assert app.second_copy_possible(record) is False
    assert await app.dead_letters() == []
    await worker.run_once()
    done = (await app.get(n.delivery_id)).delivery
    assert (done.status, done.doubt) == (DeliveryStatus.SENT, None)
    assert provider.effective(n.idempotency_key) == 1
    assert provider.received(n.idempotency_key) == 2


async def test_reconcile_and_the_retry_warning_where_the_provider_cannot_be_asked(
    make_app, clock
) -> None:
    """Held in doubt on a channel without lookup: reconcile refuses (it cannot ask), and
    the retry's warning says a second copy is possible."""
    provider = FlakyProvider(idempotent=False, script=["accept_then_timeout"])
    app = await make_app(provider, on_unknown=OnUnknown.HOLD, max_attempts=1)
    n = await app.notify("e", "u", "push", {})
    await app.worker(settings=SETTINGS).run_once()
    clock.advance(3600)
    record = await app.get(n.delivery_id)
    assert record.delivery.status is DeliveryStatus.IN_DOUBT
    with pytest.raises(ActionRefused, match="cannot be asked") as refused:
        await app.reconcile(n.delivery_id)
    assert refused.value.code == "not_reconcilable"
    assert app.second_copy_possible(record) is True
    sent = await app.get((await app.notify("e2", "u", "push", {})).delivery_id)
    assert app.second_copy_possible(sent) is False  # nothing in doubt
