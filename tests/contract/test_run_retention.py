"""Retention of workflow runs, topic events and ended subscriptions on both backends: a
run over goes after its deliveries, its key kept so that the event given again starts
nothing; a run not over (waiting, or canceled and coming back) keeps its deliveries
and itself; a topic event fully fanned out goes, its key kept, one still expanding
never; an ended subscription goes once no fan-out reads it."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from test_topics import _expander

from kirim.channels import Channel, OnUnknown
from kirim.config import Config
from kirim.engine import Kirim
from kirim.notify.types import parse_type
from kirim.runs import RunStatus
from kirim.store.retention import PruneResult
from kirim.testing import FlakyProvider, ManualClock
from kirim.worker import WorkerSettings

DAY = 86_400.0
KEEP, KEYS = 30 * DAY, 365 * DAY
SETTINGS = WorkerSettings(lease=30.0, backoff_base=1.0, backoff_max=1.0)
TEMPLATES = {"email": {"subject": "{{ title }}", "body": "{{ title }}"}}
ONCE = parse_type("once", {"templates": TEMPLATES, "steps": [{"send": "email"}]})
LONG = parse_type(
    "long",
    {
        "templates": TEMPLATES,
        "steps": [{"send": "email"}, {"delay": "60d"}, {"send": "email", "name": "again"}],
    },
)
LATER = parse_type(
    "later", {"templates": TEMPLATES, "steps": [{"delay": "60d"}, {"send": "email"}]}
)
PLAIN = parse_type("plain", {"templates": TEMPLATES})


@pytest.fixture
def email() -> FlakyProvider:
    return FlakyProvider()


@pytest.fixture
async def app(database_url: str, clock: ManualClock, email: FlakyProvider) -> AsyncIterator[Kirim]:
    channels = {"email": Channel(name="email", provider=email, on_unknown=OnUnknown.RETRY)}
    kirim = Kirim(
        Config(database=database_url, max_attempts=3),
        channels=channels,
        clock=clock,
        types=[ONCE, LONG, LATER, PLAIN],
    )
    await kirim.open(migrate=True)
    yield kirim
    await kirim.close()


def count(url: str, table: str) -> int:
    sql = f"SELECT count(*) FROM {table}"
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            return int(db.execute(sql).fetchone()[0])
    with psycopg.connect(url) as db:
        row: Any = db.execute(sql).fetchone()
        return int(row[0])


async def drain(app: Kirim) -> None:
    worker = app.worker(settings=SETTINGS)
    while await worker.run_once():
        pass


async def newest(app: Kirim, n: str) -> None:
    """A newer plain delivery, sent: the rows holding the newest ids always stay."""
    await app.notify_event("plain", ["z"], {"title": "newest"}, event_id=f"newest-{n}")
    await drain(app)


async def prune(app: Kirim, *, dry_run: bool = False, limit: int = 500) -> PruneResult:
    return await app.store.prune(  # type: ignore[attr-defined, no-any-return]
        now=app.clock.now(), keep=KEEP, keys=KEYS, limit=limit, dry_run=dry_run
    )


async def _run(app: Kirim, type: str, event_id: str) -> int:
    result = await app.notify_event(type, ["u1"], {"title": "t"}, event_id=event_id)
    (run,) = result.runs
    return run.run_id


async def test_a_run_over_goes_after_its_deliveries_and_its_event_starts_none_again(
    app: Kirim, clock: ManualClock, email: FlakyProvider, database_url: str
) -> None:
    """A done run, its delivery sent, goes with its steps once both are older than the
    retention (the dry run counts it first); the event given again answers the run
    as it ended (not created) and nothing is sent twice."""
    run_id = await _run(app, "once", "e1")
    await drain(app)
    assert (await app.must_get_run(run_id)).status is RunStatus.DONE
    assert len(email.requests) == 1
    clock.advance(KEEP + 1)
    await newest(app, "1")
    counted = await prune(app, dry_run=True)
    assert (counted.runs, counted.run_steps) == (1, 1)
    done = await prune(app)
    assert (done.deliveries, done.runs, done.run_steps) == (1, 1, 1)
    assert await app.get_run(run_id) is None
    assert count(database_url, "kirim_run_steps") == 0
    again = await app.notify_event("once", ["u1"], {"title": "t"}, event_id="e1")
    assert [(r.run_id, r.created, r.status) for r in again.runs] == [
        (run_id, False, RunStatus.DONE)
    ]
    await drain(app)
    assert len(email.requests) == 2  # the first, and the newest plain one: no second run
    assert count(database_url, "kirim_runs") == 0


async def test_after_the_keys_horizon_the_event_starts_a_run_again(
    app: Kirim, clock: ManualClock, database_url: str
) -> None:
    """The run's tombstone goes ``keys`` after the prune; then the event is new again."""
    run_id = await _run(app, "once", "e1")
    await drain(app)
    clock.advance(KEEP + 1)
    await newest(app, "1")
    assert (await prune(app)).runs == 1
    clock.advance(KEYS + 1)
    expired = await prune(app)
    assert expired.record_tombstones_expired == 1
    assert count(database_url, "kirim_run_tombstones") == 0
    again = await app.notify_event("once", ["u1"], {"title": "t"}, event_id="e1")
    assert again.runs[0].created
    assert again.runs[0].run_id != run_id


async def test_a_waiting_run_keeps_its_deliveries_and_itself(
    app: Kirim, clock: ManualClock, database_url: str
) -> None:
    """A run waiting on a long delay is not over: its first step's delivery, sent long
    ago, stays (its run may still read it), and so does the run."""
    run_id = await _run(app, "long", "e1")
    await drain(app)
    clock.advance(KEEP + 1)
    await newest(app, "1")
    done = await prune(app)
    assert (done.deliveries, done.runs) == (0, 0)
    run = await app.must_get_run(run_id)
    assert run.status is RunStatus.WAITING
    assert run.recorded[0].delivery_status is not None  # its delivery is still there


async def test_a_waiting_run_with_no_delivery_yet_stays(
    app: Kirim, clock: ManualClock, email: FlakyProvider
) -> None:
    """A run waiting on its first delay, older than the retention, has no delivery to
    keep it: it stays because it is not over, and sends its step when due."""
    run_id = await _run(app, "later", "e1")
    await drain(app)
    clock.advance(KEEP + 1)
    await newest(app, "1")
    assert (await prune(app)).runs == 0
    assert (await app.must_get_run(run_id)).status is RunStatus.WAITING
    clock.advance(60 * DAY)
    await drain(app)
    assert (await app.must_get_run(run_id)).status is RunStatus.DONE
    assert len(email.requests) == 2


async def test_a_canceled_run_that_comes_back_is_kept(
    database_url: str, clock: ManualClock
) -> None:
    """A run canceled while its step's request may still land comes back later
    (``next_at`` set): neither it nor its delivery goes while it may."""
    email = FlakyProvider(idempotent=False, script=["accept_then_timeout"])
    channels = {"email": Channel(name="email", provider=email, on_unknown=OnUnknown.RETRY)}
    app = Kirim(
        Config(database=database_url, max_attempts=3),
        channels=channels,
        clock=clock,
        types=[ONCE, PLAIN],
    )
    await app.open(migrate=True)
    try:
        run_id = await _run(app, "once", "x")
        await app.worker(settings=SETTINGS).run_once()  # sent, its answer lost
        canceled = await app.cancel_run(run_id)
        assert canceled.run.next_at is not None
        clock.advance(KEEP + 1)  # no worker comes back meanwhile
        await app.notify_event("plain", ["z"], {"title": "n"}, event_id="newest")
        done = await prune(app)
        assert (done.deliveries, done.runs) == (0, 0)
        run = await app.must_get_run(run_id)
        assert run.status is RunStatus.CANCELED
        assert run.next_at is not None
        assert run.recorded[0].delivery_status is not None
        await drain(app)  # it comes back, cancels its delivery (held): now it is over
        clock.advance(KEEP + 1)
        await newest(app, "2")
        done = await prune(app)
        assert (done.deliveries, done.runs) == (2, 1)
        assert await app.get_run(run_id) is None
    finally:
        await app.close()


async def test_a_topic_event_done_goes_and_given_again_fans_out_nothing(
    app: Kirim, clock: ManualClock, database_url: str
) -> None:
    """A topic event fully fanned out goes after the retention (not the newest: it
    stays); given again it is found done, and a subscriber who came since gets none."""
    await app.subscribe("p", "u1")
    await app.notify_topic("plain", "p", {"title": "a"}, event_id="e1")
    expander = _expander(app)
    while await expander.step():
        pass
    await app.notify_topic("plain", "p", {"title": "b"}, event_id="e2")
    while await expander.step():
        pass
    clock.advance(KEEP + 1)
    assert (await prune(app, dry_run=True)).topic_events == 1
    assert (await prune(app)).topic_events == 1
    assert count(database_url, "kirim_topic_events") == 1  # the newest stays
    await app.subscribe("p", "u2")
    again = await app.notify_topic("plain", "p", {"title": "a"}, event_id="e1")
    assert not again.created
    assert again.status.value == "done"
    before = count(database_url, "kirim_topic_events")
    while await expander.step():
        pass
    assert count(database_url, "kirim_topic_events") == before
    page = await app.records(limit=50)
    assert {r[0].recipient for r in page.records if r[0].event_id == "e1"} <= {"u1"}


async def test_an_expanding_topic_event_and_the_subscriptions_it_reads_stay(
    app: Kirim, clock: ManualClock, database_url: str
) -> None:
    """An event still expanding never goes, nor a subscription it reads though ended
    long ago; once the fan-out is done and old, both go."""
    for r in ("a", "b", "c"):
        await app.subscribe("p", r)
    await app.notify_topic("plain", "p", {"title": "a"}, event_id="e1")
    await app.unsubscribe("p", "c")  # after the mark: the fan-out still reads it
    await app.notify_topic("plain", "p", {"title": "b"}, event_id="e2")
    clock.advance(KEEP + 1)
    done = await prune(app)
    assert (done.topic_events, done.subscriptions) == (0, 0)
    assert count(database_url, "kirim_topic_subscriptions") == 3
    expander = _expander(app)
    while await expander.step():
        pass
    clock.advance(KEEP + 1)
    done = await prune(app)
    assert (done.topic_events, done.subscriptions) == (1, 1)
    assert count(database_url, "kirim_topic_subscriptions") == 2


async def test_postgres_prune_skips_a_run_another_transaction_holds(
    app: Kirim, clock: ManualClock, database_url: str
) -> None:
    """PostgreSQL: a run locked by another transaction (a cancel, an advance) stays for
    a later round, never waited for; its delivery goes (it is at rest)."""
    if not database_url.startswith("postgresql:"):
        pytest.skip("row locks: PostgreSQL only (SQLite serialises every writer)")
    run_id = await _run(app, "once", "e1")
    await drain(app)
    clock.advance(KEEP + 1)
    await newest(app, "1")
    other = await psycopg.AsyncConnection.connect(database_url)
    async with other, other.transaction():
        await other.execute("SELECT 1 FROM kirim_runs WHERE id = %s FOR UPDATE", (run_id,))
        done = await asyncio.wait_for(prune(app), timeout=10)
        assert (done.deliveries, done.runs) == (1, 0)
    assert (await prune(app)).runs == 1
    assert await app.get_run(run_id) is None


async def test_postgres_an_event_given_again_while_its_run_is_pruned_starts_none(
    app: Kirim, clock: ManualClock, database_url: str
) -> None:
    """PostgreSQL: an event given again while a prune deletes its run (the insert
    waits on the run's key, then finds it gone) starts no second run: it finds the
    tombstone committed with the deletion."""
    if not database_url.startswith("postgresql:"):
        pytest.skip("concurrent transactions: PostgreSQL only (SQLite serialises writers)")
    run_id = await _run(app, "once", "e1")
    await drain(app)
    clock.advance(KEEP + 1)
    await newest(app, "1")
    pruner = await psycopg.AsyncConnection.connect(database_url)
    async with pruner:
        async with pruner.transaction():  # what prune does to the run, not committed yet
            await pruner.execute(
                "INSERT INTO kirim_run_tombstones SELECT key, id, type, event_id, recipient_id,"
                " status, cursor, why, created_at, updated_at, %s FROM kirim_runs WHERE id = %s",
                (clock.now(), run_id),
            )
            await pruner.execute("DELETE FROM kirim_run_steps WHERE run_id = %s", (run_id,))
            await pruner.execute("DELETE FROM kirim_runs WHERE id = %s", (run_id,))
            again = asyncio.ensure_future(
                app.notify_event("once", ["u1"], {"title": "t"}, event_id="e1")
            )
            await asyncio.sleep(0.5)
            assert not again.done()  # it waits on the run's key
        result = await asyncio.wait_for(again, timeout=10)
    assert [(r.run_id, r.created) for r in result.runs] == [(run_id, False)]
    assert count(database_url, "kirim_runs") == 0
