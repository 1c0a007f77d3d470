"""Workflow runs on both backends: one run per (type, event, recipient); each step's
delivery once, under retried events and retried steps; a delay holds the run until
it is due; a branch on the inbox's read state is decided once, by the holder of the
run's claim; a ``cancel_on`` event cancels the pending steps of matching runs, and a
step whose request may have left is ``canceled (held)``, never called unsent."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from kirim.channels import Channel, OnUnknown
from kirim.config import Config
from kirim.engine import Kirim
from kirim.model import DeliveryStatus, Doubt
from kirim.notify.types import parse_type
from kirim.providers.inbox import InboxProvider
from kirim.runs import RunStatus, StepOutcome
from kirim.testing import FlakyProvider, ManualClock
from kirim.worker import WorkerSettings

SETTINGS = WorkerSettings(lease=30.0, backoff_base=1.0, backoff_max=1.0)
ESCALATE = parse_type(
    "escalate",
    {
        "templates": {
            "inbox": {"title": "Order {{ order_id }} needs you", "body": "Open it."},
            "email": {"subject": "Order {{ order_id }} needs you", "body": "Open it."},
        },
        "cancel_on": ["order_done"],
        "cancel_key": "order_id",
        "steps": [
            {"send": "inbox"},
            {"delay": "1h"},
            {"branch": "unread", "step": "inbox"},
            {"send": "email"},
        ],
    },
)


@pytest.fixture
def email() -> FlakyProvider:
    return FlakyProvider()


@pytest.fixture
async def app(database_url: str, clock: ManualClock, email: FlakyProvider) -> AsyncIterator[Kirim]:
    channels = {
        "inbox": Channel(name="inbox", provider=InboxProvider()),
        "email": Channel(name="email", provider=email),
    }
    kirim = Kirim(Config(database=database_url), channels=channels, clock=clock, types=[ESCALATE])
    await kirim.open(migrate=True)
    yield kirim
    await kirim.close()


async def drain(app: Kirim) -> None:
    worker = app.worker(settings=SETTINGS)
    while await worker.run_once():
        pass


async def _run(app: Kirim, event_id: str = "e1", order: str = "o1") -> int:
    result = await app.notify_event("escalate", ["u1"], {"order_id": order}, event_id=event_id)
    assert result.deliveries == ()
    (run,) = result.runs
    return run.run_id


async def test_unread_inbox_escalates_to_email_once(
    app: Kirim, clock: ManualClock, email: FlakyProvider
) -> None:
    """The inbox message goes at once; after the hour, still unread, the email goes,
    once, though the event is given again and the worker runs again."""
    run_id = await _run(app)
    await drain(app)
    assert len((await app.feed("u1")).items) == 1
    assert email.requests == []
    again = await app.notify_event("escalate", ["u1"], {"order_id": "o1"}, event_id="e1")
    assert [(r.run_id, r.created) for r in again.runs] == [(run_id, False)]
    clock.advance(3599)
    await drain(app)
    assert email.requests == []
    clock.advance(2)
    await drain(app)
    await drain(app)
    assert len(email.requests) == 1
    run = await app.must_get_run(run_id)
    assert run.status is RunStatus.DONE
    assert [s.outcome for s in run.recorded] == [
        StepOutcome.SENT,
        StepOutcome.WAITED,
        StepOutcome.THEN,
        StepOutcome.SENT,
    ]
    assert run.recorded[3].delivery_status is DeliveryStatus.SENT
    await app.notify_event("escalate", ["u1"], {"order_id": "o1"}, event_id="e1")
    clock.advance(7200)
    await drain(app)
    assert len(email.requests) == 1
    assert len((await app.feed("u1")).items) == 1


async def test_read_inbox_takes_the_else_way(
    app: Kirim, clock: ManualClock, email: FlakyProvider
) -> None:
    """Read within the hour: the branch is false, the email step is skipped, the run
    ends, and no email goes."""
    run_id = await _run(app)
    await drain(app)
    (item,) = (await app.feed("u1")).items
    await app.feed_action("u1", item.id, "read")
    clock.advance(3601)
    await drain(app)
    assert email.requests == []
    run = await app.must_get_run(run_id)
    assert run.status is RunStatus.DONE
    assert [s.outcome for s in run.recorded] == [
        StepOutcome.SENT,
        StepOutcome.WAITED,
        StepOutcome.ELSE,
        StepOutcome.SKIPPED,
    ]
    assert "read" in run.recorded[2].why


async def test_a_lost_claim_records_nothing(app: Kirim, clock: ManualClock) -> None:
    """A worker whose claim expired and was taken over cannot record the branch: the
    new holder decides it, once."""
    run_id = await _run(app)
    await drain(app)
    clock.advance(3601)
    (old,) = await app.store.claim_runs(worker_id="w1", now=clock.now(), lease=10, limit=5)
    clock.advance(11)
    (new,) = await app.store.claim_runs(worker_id="w2", now=clock.now(), lease=10, limit=5)
    assert new.token != old.token
    assert await app.store.advance_run(run_id, old.token, now=clock.now()) is None
    done = await app.store.advance_run(run_id, new.token, now=clock.now())
    assert done is not None
    assert [s.outcome for s in done.recorded] == [StepOutcome.THEN, StepOutcome.SENT]
    assert await app.store.advance_run(run_id, old.token, now=clock.now()) is None
    run = await app.must_get_run(run_id)
    assert [s.index for s in run.recorded] == [0, 1, 2, 3]


async def test_cancel_on_event_cancels_pending_steps(
    app: Kirim, clock: ManualClock, email: FlakyProvider
) -> None:
    """An ``order_done`` event with the same order_id cancels the run: after the hour,
    nothing more is sent; a run of another order goes on."""
    run_id = await _run(app)
    other = await _run(app, "e2", "o2")
    await drain(app)
    done = await app.cancel_by_event("order_done", {"order_id": "o1"})
    assert [c.run.id for c in done] == [run_id]
    assert done[0].left  # the inbox message was sent already: named, not canceled
    clock.advance(3601)
    await drain(app)
    await drain(app)
    assert len(email.requests) == 1
    assert (await app.must_get_run(run_id)).status is RunStatus.CANCELED
    assert (await app.must_get_run(other)).status is RunStatus.DONE
    assert await app.cancel_by_event("order_done", {"order_id": "o1"}) == []


async def test_cancel_a_step_not_yet_sent(app: Kirim, clock: ManualClock) -> None:
    """A run canceled before its worker sends the step's delivery: the delivery is
    canceled, nothing goes, and the run stays canceled."""
    run_id = await _run(app)
    (claim,) = await app.store.claim_runs(worker_id="w1", now=clock.now(), lease=10, limit=5)
    advanced = await app.store.advance_run(run_id, claim.token, now=clock.now())
    assert advanced is not None
    delivery_id = advanced.recorded[0].delivery_id
    assert delivery_id is not None
    canceled = await app.cancel_run(run_id)
    assert canceled.canceled == (delivery_id,)
    await drain(app)
    assert (await app.feed("u1")).items == []
    record = await app.get(delivery_id)
    assert record is not None
    assert record.delivery.status is DeliveryStatus.CANCELED


async def test_cancel_after_a_request_may_have_left_is_held(
    database_url: str, clock: ManualClock
) -> None:
    """A step whose earlier request may have reached the user (its answer lost, the
    retry due) is canceled ``held``, and the run's cancellation says so."""
    email = FlakyProvider(idempotent=False, script=["accept_then_timeout"])
    channels = {
        "inbox": Channel(name="inbox", provider=InboxProvider()),
        "email": Channel(name="email", provider=email, on_unknown=OnUnknown.RETRY),
    }
    email_first = parse_type(
        "mail_first",
        {
            "templates": {"email": {"subject": "s", "body": "b"}},
            "steps": [{"send": "email"}, {"delay": "1h"}, {"send": "email", "name": "again"}],
        },
    )
    config = Config(database=database_url, max_attempts=3)
    app = Kirim(config, channels=channels, clock=clock, types=[email_first])
    await app.open(migrate=True)
    try:
        result = await app.notify_event("mail_first", ["u1"], {}, event_id="x")
        run_id = result.runs[0].run_id
        worker = app.worker(settings=SETTINGS)
        await worker.run_once()  # the run makes the delivery, the worker sends it: lost answer
        clock.advance(120)  # every request settled; the retry is due
        run = await app.must_get_run(run_id)
        delivery_id = run.recorded[0].delivery_id
        assert delivery_id is not None
        canceled = await app.cancel_run(run_id)
        assert canceled.held == (delivery_id,), canceled
        record = await app.get(delivery_id)
        assert record is not None
        assert record.delivery.status is DeliveryStatus.CANCELED
        assert record.delivery.doubt is Doubt.HELD
    finally:
        await app.close()


async def test_kirim_run_show_and_cancel(app: Kirim, clock: ManualClock, database_url: str) -> None:
    """``kirim run show`` prints the run's steps on one timeline (what ran, what waits
    until when, what comes next); ``kirim run cancel`` cancels it, and again exits 1."""
    import asyncio
    import json

    from click.testing import CliRunner, Result

    from kirim.cli import main

    run_id = await _run(app)
    await drain(app)

    class Runner:
        async def invoke(self, cli: object, args: list[str]) -> Result:
            return await asyncio.to_thread(CliRunner().invoke, main, args)

    runner = Runner()
    shown = await runner.invoke(main, ["--database", database_url, "run", "show", str(run_id)])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert "waiting" in lines[0]
    assert "sent  delivery" in lines[1]
    assert "waits  until" in lines[2]
    assert "to come" in lines[4]
    as_json = await runner.invoke(
        main, ["--database", database_url, "status", f"run:{run_id}", "--json"]
    )
    assert [s["state"] for s in json.loads(as_json.output)["steps"]] == [
        "sent",
        "waits",
        "next",
        "to come",
    ]
    done = await runner.invoke(main, ["--database", database_url, "run", "cancel", str(run_id)])
    assert done.exit_code == 0, done.output
    assert "not canceled" in done.output  # the inbox message was sent already
    again = await runner.invoke(main, ["--database", database_url, "run", "cancel", str(run_id)])
    assert again.exit_code == 1


async def test_the_dashboard_shows_a_run_as_its_steps(app: Kirim, clock: ManualClock) -> None:
    """/dashboard/runs/N: each step with its state, the send linked to its
    notification's page; a run that does not exist is a 404 page."""
    from http_kit import api_on
    from kirim.config import ServeSettings

    run_id = await _run(app)
    await drain(app)
    async with api_on(app, settings=ServeSettings(allowed_hosts=("testserver",))) as api:
        page = await api.client.get(f"/dashboard/runs/{run_id}", headers={"Authorization": ""})
        assert page.status_code == 200
        states = re.findall(r'class="step" data-state="([^"]+)"', page.text)
        assert states == ["sent", "waits", "next", "to come"]
        run = await app.must_get_run(run_id)
        assert f'href="/dashboard/notifications/{run.recorded[0].delivery_id}"' in page.text
        missing = await api.client.get("/dashboard/runs/999", headers={"Authorization": ""})
        assert missing.status_code == 404


async def test_a_step_not_settled_when_canceled_is_canceled_once_it_settles(
    database_url: str, clock: ManualClock
) -> None:
    """A cancellation while the step's earlier request may still land names it (not
    settled) and comes back: once the request is settled, a worker cancels the
    delivery (held) before its retry is sent."""
    email = FlakyProvider(idempotent=False, script=["accept_then_timeout"])
    channels = {"email": Channel(name="email", provider=email, on_unknown=OnUnknown.RETRY)}
    once = parse_type(
        "once",
        {"templates": {"email": {"subject": "s", "body": "b"}}, "steps": [{"send": "email"}]},
    )
    app = Kirim(
        Config(database=database_url, max_attempts=3), channels=channels, clock=clock, types=[once]
    )
    await app.open(migrate=True)
    try:
        result = await app.notify_event("once", ["u1"], {}, event_id="x")
        run_id = result.runs[0].run_id
        worker = app.worker(settings=SETTINGS)
        await worker.run_once()  # sent, the answer lost: a retry is due, the request unsettled
        canceled = await app.cancel_run(run_id)
        assert len(canceled.left) == 1, canceled
        (delivery_id,) = canceled.left
        assert "not settled" in canceled.left[delivery_id]
        clock.advance(200)  # the request is settled now; the retry is due too
        await worker.run_once()  # the run comes back first and cancels the delivery
        await worker.run_once()
        record = await app.get(delivery_id)
        assert record is not None
        assert record.delivery.status is DeliveryStatus.CANCELED
        assert record.delivery.doubt is Doubt.HELD
        assert len(email.requests) == 1  # the retry never went
        assert (await app.must_get_run(run_id)).next_at is None
    finally:
        await app.close()
