"""An event and the runs it cancels (a type's ``cancel_on``) are one transaction, on
both backends: a crash after the event's first commit cannot leave a kept HTTP answer
whose cancellation was lost; an application's rolled-back transaction (``connection=``)
cancels nothing; a workflow type's events go over HTTP, in the caller's transaction and
to a topic.

The crash is forced, not hoped for: the store's driver is made to die (raise) right
after the commit of the event's recording, as a process killed there
would, and the request is then given again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
import pytest
from test_topics import _expander

from http_kit import Api, api_on
from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.errors import InvalidNotification
from kirim.notify.types import parse_type
from kirim.providers.inbox import InboxProvider
from kirim.runs import RunStatus
from kirim.testing import FlakyProvider, ManualClock
from kirim.topics import TopicEvent
from pg import fresh_database

ESCALATE = parse_type(
    "escalate",
    {
        "templates": {
            "inbox": {"title": "Order {{ order_id }} needs you", "body": "Open it."},
            "email": {"subject": "Order {{ order_id }} needs you", "body": "Open it."},
        },
        "cancel_on": ["order_done"],
        "cancel_key": "order_id",
        "steps": [{"send": "inbox"}, {"delay": "1h"}, {"send": "email"}],
    },
)
DONE = parse_type("order_done", {"templates": {"inbox": {"title": "Order {{ order_id }} done"}}})


class Killed(BaseException):
    """The process died here (a BaseException: nothing on the way catches it)."""


def _app(url: str) -> Kirim:
    channels = {
        "inbox": Channel(name="inbox", provider=InboxProvider()),
        "email": Channel(name="email", provider=FlakyProvider()),
    }
    return Kirim(
        Config(database=url), channels=channels, clock=ManualClock(), types=[ESCALATE, DONE]
    )


@pytest.fixture
async def api(database_url: str) -> AsyncIterator[Api]:
    kirim = _app(database_url)
    await kirim.open(migrate=True)
    try:
        async with api_on(kirim) as found:
            yield found
    finally:
        await kirim.close()


def _die_after_commits(kirim: Kirim, monkeypatch: pytest.MonkeyPatch, writes: int) -> None:
    """The ``writes``-th write the store commits from now is the last thing this
    process does."""
    driver: Any = kirim.store.driver  # type: ignore[attr-defined]
    run = driver.run
    left = [writes]

    async def once(op: Any, *, write: bool = True, snapshot: bool = True) -> Any:
        result = await run(op, write=write, snapshot=snapshot)
        left[0] -= write
        if not left[0]:
            monkeypatch.setattr(driver, "run", run)
            raise Killed
        return result

    monkeypatch.setattr(driver, "run", once)


async def _waiting_run(kirim: Kirim) -> int:
    started = await kirim.notify_event("escalate", ["u1"], {"order_id": "o1"}, event_id="e1")
    (run,) = started.runs
    return run.run_id


DONE_EVENT = {
    "type": "order_done",
    "event_id": "done-o1",
    "recipients": ["u1"],
    "data": {"order_id": "o1"},
}


async def test_a_crash_after_the_events_commit_cannot_lose_its_cancellation(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept answer of a replayed request is that of an event whose runs were
    canceled with it: the event, its cancellations and the answer commit together."""
    run_id = await _waiting_run(api.kirim)
    _die_after_commits(api.kirim, monkeypatch, 2)  # 1: the key taken; 2: the event
    with pytest.raises(Killed):
        await api.client.post("/v1/events", json=DONE_EVENT, headers={"Idempotency-Key": "k1"})
    again = await api.client.post("/v1/events", json=DONE_EVENT, headers={"Idempotency-Key": "k1"})
    assert again.status_code == 201, again.text
    assert (await api.kirim.must_get_run(run_id)).status is RunStatus.CANCELED
    assert again.json()["canceled_runs"] == [run_id]


async def test_a_refused_event_cancels_nothing(api: Api) -> None:
    """An event rolled back whole (its key names another notification) takes its
    cancellations back with it."""
    run_id = await _waiting_run(api.kirim)
    first = await api.kirim.notify_event("order_done", ["u1"], {"order_id": "o2"}, event_id="d")
    assert first.canceled_runs == ()
    other = {**DONE_EVENT, "event_id": "d", "data": {"order_id": "o1"}}
    refused = await api.client.post("/v1/events", json=other)
    assert refused.status_code == 422, refused.text
    assert (await api.kirim.must_get_run(run_id)).status is RunStatus.WAITING


async def test_a_workflow_event_over_http_starts_its_runs_once(api: Api) -> None:
    """A workflow type's event is recorded over HTTP: its runs, once; a replay
    answers the same."""
    body = {"type": "escalate", "event_id": "e1", "recipients": ["u1", "u2"], "data": {}}
    body["data"] = {"order_id": "o1"}
    first = await api.client.post("/v1/events", json=body)
    assert first.status_code == 201, first.text
    runs = first.json()["runs"]
    assert sorted(r["recipient_id"] for r in runs) == ["u1", "u2"]
    assert all(r["created"] for r in runs)
    again = await api.client.post("/v1/events", json=body)
    assert again.json() == first.json()
    under_another_key = await api.client.post(
        "/v1/events", json=body, headers={"Idempotency-Key": "other"}
    )
    assert under_another_key.status_code == 200, under_another_key.text
    assert [r["created"] for r in under_another_key.json()["runs"]] == [False, False]


@pytest.fixture
async def pg_app(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Kirim, str]]:
    url = fresh_database(request)
    kirim = _app(url)
    await kirim.open(migrate=True)
    try:
        yield kirim, url
    finally:
        await kirim.close()


async def test_a_rolled_back_transaction_cancels_nothing(pg_app: tuple[Kirim, str]) -> None:
    """``connection=``: the event's cancellations are the caller's transaction's, and
    go with its rollback; committed, they are there."""
    kirim, url = pg_app
    run_id = await _waiting_run(kirim)
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await kirim.notify_event(
            "order_done", ["u1"], {"order_id": "o1"}, event_id="d1", connection=conn
        )
        await conn.rollback()
    assert (await kirim.must_get_run(run_id)).status is RunStatus.WAITING
    async with await psycopg.AsyncConnection.connect(url) as conn:
        done = await kirim.notify_event(
            "order_done", ["u1"], {"order_id": "o1"}, event_id="d1", connection=conn
        )
        await conn.commit()
    assert (await kirim.must_get_run(run_id)).status is RunStatus.CANCELED
    assert done.canceled_runs == (run_id,)


async def test_a_workflow_event_in_the_callers_transaction(pg_app: tuple[Kirim, str]) -> None:
    """``connection=`` for a workflow type: its runs exist when, and only if, the
    caller commits."""
    kirim, url = pg_app
    async with await psycopg.AsyncConnection.connect(url) as conn:
        gone = await kirim.notify_event(
            "escalate", ["u1"], {"order_id": "o1"}, event_id="e1", connection=conn
        )
        await conn.rollback()
    assert await kirim.get_run(gone.runs[0].run_id) is None
    async with await psycopg.AsyncConnection.connect(url) as conn:
        kept = await kirim.notify_event(
            "escalate", ["u1"], {"order_id": "o1"}, event_id="e1", connection=conn
        )
        await conn.commit()
    found = await kirim.must_get_run(kept.runs[0].run_id)
    assert found.status is RunStatus.WAITING


async def test_an_event_to_a_topic_cancels_in_its_own_transaction(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``notify_topic`` of a type another names in ``cancel_on`` cancels the matching
    runs when the topic event commits, not when (or whether) its fan-out runs."""
    run_id = await _waiting_run(api.kirim)
    await api.kirim.subscribe("orders", "u1")
    _die_after_commits(api.kirim, monkeypatch, 1)
    with pytest.raises(Killed):
        await api.kirim.notify_topic("order_done", "orders", {"order_id": "o1"}, event_id="t1")
    assert (await api.kirim.must_get_run(run_id)).status is RunStatus.CANCELED
    again = await api.kirim.notify_topic("order_done", "orders", {"order_id": "o1"}, event_id="t1")
    assert not again.created


async def test_a_workflow_type_goes_to_a_topic_as_runs(api: Api) -> None:
    """A workflow type's event to a topic, over HTTP or from the library, fans out into
    one run per subscriber (not a delivery per channel at once); one whose data its
    templates cannot render is still refused, and nothing is written."""
    for who in ("u1", "u2"):
        await api.kirim.subscribe("orders", who)
    over_http = await api.client.post(
        "/v1/topics/orders/events",
        json={"type": "escalate", "event_id": "t1", "data": {"order_id": "o1"}},
    )
    assert over_http.status_code == 202, over_http.text
    await api.kirim.notify_topic("escalate", "orders", {"order_id": "o2"}, event_id="t2")
    with pytest.raises(InvalidNotification, match="order_id"):
        await api.kirim.notify_topic("escalate", "orders", {}, event_id="t3")
    assert len(await api.kirim.store.latest_topic_events(limit=5)) == 2
    await api.kirim.worker().run(burst=True)
    runs = await api.kirim.store.list_runs(limit=10)
    assert sorted((r.event_id, r.recipient_id, r.cancel_value) for r in runs) == [
        ("t1", "u1", "o1"),
        ("t1", "u2", "o1"),
        ("t2", "u1", "o2"),
        ("t2", "u2", "o2"),
    ]
    assert {r.status for r in runs} == {RunStatus.WAITING}  # past the inbox, in the delay
    await api.kirim.cancel_by_event("order_done", {"order_id": "o1"})
    after = {(r.event_id, r.recipient_id): r.status for r in await api.kirim.store.list_runs()}
    assert after[("t1", "u1")] is RunStatus.CANCELED
    assert after[("t2", "u1")] is RunStatus.WAITING


@pytest.mark.parametrize("via", ["library", "event", "topic"])
async def test_a_cancellation_during_a_fan_out_cancels_its_later_runs(api: Api, via: str) -> None:
    """A cancelling event committed while a workflow type's topic event still fans out
    cancels the runs of the batches after it too, not only those started before it:
    nothing of that event is sent after the cancellation; an unrelated fan-out goes on."""
    kirim = api.kirim
    for who in ("u1", "u2", "u3"):
        await kirim.subscribe("orders", who)
    await kirim.notify_topic("escalate", "orders", {"order_id": "o1"}, event_id="t1")
    await kirim.notify_topic("escalate", "orders", {"order_id": "o2"}, event_id="t2")
    expander = _expander(kirim, batch=1)
    data = {"order_id": "o1"}
    canceled: list[int] = []

    async def cancel_midway(event: TopicEvent, batch: Sequence[str]) -> None:
        """After t1's first batch (u1's run) committed, before u2's is planned."""
        if event.event_id != "t1" or event.batches != 1 or canceled:
            return
        if via == "library":
            canceled.extend(c.run.id for c in await kirim.cancel_by_event("order_done", data))
        elif via == "event":
            done = await kirim.notify_event("order_done", ["u1"], data, event_id="d1")
            canceled.extend(done.canceled_runs)
        else:
            await kirim.notify_topic("order_done", "orders", data, event_id="d1")
            canceled.append(0)

    expander.before_batch = cancel_midway
    while await expander.step():
        pass
    assert len(canceled) == 1  # u1's run, the only one started when it committed
    await kirim.worker().run(burst=True)
    runs = {(r.event_id, r.recipient_id): r.status for r in await kirim.store.list_runs()}
    assert runs == {
        **{("t1", who): RunStatus.CANCELED for who in ("u1", "u2", "u3")},
        **{("t2", who): RunStatus.WAITING for who in ("u1", "u2", "u3")},
    }
    for run in await kirim.store.list_runs():
        if run.event_id == "t1" and run.recipient_id != "u1":  # started canceled
            assert (await kirim.must_get_run(run.id)).recorded == (), run
    events = {e.event_id: e for e in await kirim.store.latest_topic_events(limit=10)}
    assert events["t1"].cancel_why == "event order_done (order_id = o1)"
    assert events["t2"].canceled_at is None
    shown = await api.client.get("/v1/topics/orders")
    assert shown.status_code == 200, shown.text
    why = {e["event_id"]: e["cancel_why"] for e in shown.json()["recent"]}
    assert why["t1"] == "event order_done (order_id = o1)"
    assert why["t2"] is None


async def test_a_cancellation_waits_for_the_batch_under_way(
    pg_app: tuple[Kirim, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL, the interleaving forced: a cancellation that comes while a batch of
    the fan-out holds its topic event's row (its progress fenced, its runs not yet
    committed) waits for that batch and cancels its runs too: it marks the fan-out
    before it reads the runs to cancel."""
    from kirim.store.postgres import driver as pg_driver

    kirim, url = pg_app
    for who in ("u1", "u2", "u3"):
        await kirim.subscribe("orders", who)
    await kirim.notify_topic("escalate", "orders", {"order_id": "o1"}, event_id="t1")
    execute, together = pg_driver.execute, pg_driver.together
    armed, locked, go = [False], asyncio.Event(), asyncio.Event()

    async def paused(names: list[str]) -> None:
        if "advance_topic_event" in names and armed[0]:
            armed[0] = False
            locked.set()  # the batch holds the topic event's row, its runs to come
            await go.wait()

    async def pausing(cur: Any, step: Any, *skip: Any) -> Any:
        answer = await execute(cur, step, *skip)
        await paused([step.name])
        return answer

    async def pausing_together(cur: Any, steps: Any, *skip: Any) -> Any:
        # a transaction's first statement goes with its settings (no_jit)
        answers = await together(cur, steps, *skip)
        await paused([step.name for step in steps])
        return answers

    monkeypatch.setattr(pg_driver, "execute", pausing)
    monkeypatch.setattr(pg_driver, "together", pausing_together)
    expander = _expander(kirim, batch=1)

    async def arm(event: TopicEvent, batch: Sequence[str]) -> None:
        armed[0] = event.batches == 1  # u2's batch

    expander.before_batch = arm
    expanding = asyncio.create_task(expander.step())
    await asyncio.wait_for(locked.wait(), 30)
    canceling = asyncio.create_task(kirim.cancel_by_event("order_done", {"order_id": "o1"}))
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as watch:
        for _ in range(300):  # until the cancellation waits on a row lock (bounded)
            cur = await watch.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            row = await cur.fetchone()
            if (row is not None and row[0]) or canceling.done():
                break
            await asyncio.sleep(0.05)
    assert not canceling.done()  # it waits for the batch
    go.set()
    canceled = await asyncio.wait_for(canceling, 30)
    await asyncio.wait_for(expanding, 30)
    assert sorted(c.run.recipient_id for c in canceled) == ["u1", "u2"]
    runs = {r.recipient_id: r.status for r in await kirim.store.list_runs()}
    assert runs == {who: RunStatus.CANCELED for who in ("u1", "u2", "u3")}
