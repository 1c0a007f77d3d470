"""Topics on every backend: subscriptions with history, an event to a topic recorded with
its mark, and its fan-out in batches, to the subscribers as of the mark, exactly once,
across a crashed expander and a retried event."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.errors import InvalidNotification
from kirim.keys import default_key
from kirim.model import DeliveryStatus
from kirim.notify import parse_type
from kirim.observe.logging import get_logger
from kirim.preferences import Preferences
from kirim.runs import RunStatus, run_key
from kirim.testing import FlakyProvider, ManualClock
from kirim.topics import TopicEvent, TopicEventStatus
from kirim.validation import BadValue
from kirim.worker.topics import TopicExpander

NEWS = {
    "templates": {
        "email": {"subject": "{{ title }}", "body": "{{ title }}"},
        "push": {"title": "{{ title }}"},
    }
}
#: a workflow type: push now, email an hour later
FLOW = {
    "templates": NEWS["templates"],
    "steps": [{"send": "push"}, {"delay": "1h"}, {"send": "email"}],
}
LEASE = 30.0

App = Callable[[], Awaitable[Kirim]]


@pytest.fixture
async def make(database_url: str, clock: ManualClock) -> AsyncIterator[App]:
    """Apps on one database with channels email and push and the type ``news``."""
    apps: list[Kirim] = []

    async def build() -> Kirim:
        app = Kirim(
            Config(database=database_url),
            channels={n: Channel(name=n, provider=FlakyProvider()) for n in ("email", "push")},
            clock=clock,
            types=[parse_type("news", NEWS), parse_type("news_flow", FLOW)],
        )
        await app.open(migrate=True)
        apps.append(app)
        return app

    yield build
    for app in apps:
        await app.close()


def _expander(app: Kirim, name: str = "w1", batch: int = 2) -> TopicExpander:
    return TopicExpander(
        app.store,
        app.plan_topic_batch,
        worker_id=name,
        clock=app.clock,
        lease=LEASE,
        poll_interval=1.0,
        log=get_logger(worker_id=name),
        batch=batch,
    )


async def _deliveries(app: Kirim) -> Counter[tuple[str, str]]:
    """(recipient, channel) -> how many deliveries it has."""
    page = await app.records(limit=500)
    return Counter((r[0].recipient, r[0].channel) for r in page.records)


def _each(recipients: Sequence[str]) -> Counter[tuple[str, str]]:
    return Counter((r, c) for r in recipients for c in ("email", "push"))


async def test_subscriptions_are_idempotent_and_listed(make: App) -> None:
    """Subscribing twice is one subscription; unsubscribing a recipient not subscribed
    is False; a recipient's topics and a topic's subscribers are listed in order."""
    app = await make()
    first = await app.subscribe("project:42", "u2")
    again = await app.subscribe("project:42", "u2")
    await app.subscribe("project:42", "u1")
    await app.subscribe("project:7", "u1")
    assert first.created
    assert not again.created
    assert again.added_seq == first.added_seq
    assert await app.subscribers("project:42") == ["u1", "u2"]
    assert await app.subscribers("project:42", after="u1") == ["u2"]
    assert await app.topics_of("u1") == ["project:42", "project:7"]
    assert await app.unsubscribe("project:42", "u2")
    assert not await app.unsubscribe("project:42", "u2")
    assert await app.subscribers("project:42") == ["u1"]
    info = await app.topic_info("project:42")
    assert info is not None
    assert info.subscribers == 1
    assert [t.topic for t in await app.list_topics()] == ["project:42", "project:7"]
    with pytest.raises(BadValue):
        await app.subscribe("", "u1")


async def test_a_topic_event_is_recorded_once_with_its_mark(make: App) -> None:
    """The same type, event id and topic again return the event first recorded; its
    mark is the topic's change number at its commit."""
    app = await make()
    sub = await app.subscribe("p", "u1")
    event = await app.notify_topic("news", "p", {"title": "hi"}, event_id="e1")
    again = await app.notify_topic("news", "p", {"title": "hi"}, event_id="e1")
    assert event.created
    assert not again.created
    assert again.id == event.id
    assert event.mark > sub.added_seq
    assert event.status is TopicEventStatus.EXPANDING
    with pytest.raises(InvalidNotification):  # a missing variable: nothing recorded
        await app.notify_topic("news", "p", {}, event_id="e2")
    info = await app.topic_info("p")
    assert info is not None
    assert [e.id for e in info.recent] == [event.id]


async def test_the_fan_out_goes_to_the_subscribers_as_of_the_mark(make: App) -> None:
    """Subscribed before the event: one delivery per channel, whoever unsubscribes
    after; subscribed after it (even during the fan-out): none."""
    app = await make()
    for r in ("u1", "u2", "u3", "u4", "u5"):
        await app.subscribe("p", r)
    await app.unsubscribe("p", "u5")
    await app.notify_topic("news", "p", {"title": "hi"}, event_id="e1")
    await app.unsubscribe("p", "u2")  # after the mark: still gets it
    await app.subscribe("p", "u0")  # after the mark: gets none
    expander = _expander(app)
    joined: list[str] = []

    async def join_midway(event: TopicEvent, batch: Sequence[str]) -> None:
        if event.batches == 1:
            joined.append("u9")
            await app.subscribe("p", "u9")

    expander.before_batch = join_midway
    assert await expander.step()
    assert joined == ["u9"]
    assert await _deliveries(app) == _each(["u1", "u2", "u3", "u4"])
    assert await expander.nothing_left()
    (event,) = (await app.topic_info("p") or pytest.fail("no topic")).recent
    assert event.status is TopicEventStatus.DONE
    assert event.recipients == 4
    assert event.batches == 3  # 2 + 2 + an empty last


async def test_an_expander_that_dies_mid_fan_out_is_taken_over(make: App, clock) -> None:
    """A worker that committed one batch and died: once its lease expires another
    takes the event over at its cursor; the dead one's late write is refused; every
    subscriber gets exactly one delivery per channel."""
    app = await make()
    for r in ("a", "b", "c", "d", "e"):
        await app.subscribe("p", r)
    await app.notify_topic("news", "p", {"title": "hi"}, event_id="e1")
    dying = _expander(app, "w1")
    seen: list[TopicEvent] = []

    class Died(Exception):
        pass

    async def die_on_second(event: TopicEvent, batch: Sequence[str]) -> None:
        seen.append(event)
        if len(seen) == 2:
            raise Died

    dying.before_batch = die_on_second
    with pytest.raises(Died):
        await dying.step()
    assert await _deliveries(app) == _each(["a", "b"])
    other = _expander(app, "w2")
    assert not await other.step()  # the lease still holds
    clock.advance(LEASE + 1)
    taken = await app.store.claim_topic_event(worker_id="w3", now=clock.now(), lease=LEASE)
    assert taken is not None
    assert taken.cursor == "b"
    # the dead worker's batch, written late with its old token: refused
    stale = seen[1]
    assert stale.lease_token is not None
    assert stale.lease_token != taken.lease_token
    items = await app.plan_topic_batch(stale, ["c", "d"])
    late = await app.store.expand_topic_batch(
        stale, stale.lease_token, ["c", "d"], items, last=False, now=clock.now(), lease=LEASE
    )
    assert late is None
    assert await _deliveries(app) == _each(["a", "b"])
    clock.advance(LEASE + 1)  # w3 died too
    assert await other.step()
    assert await _deliveries(app) == _each(["a", "b", "c", "d", "e"])


async def test_a_batch_done_twice_adds_nothing(make: App) -> None:
    """A batch recorded again (the same keys) returns the deliveries it made; the same
    event id to a second topic adds nothing for a recipient of both."""
    app = await make()
    for r in ("a", "b"):
        await app.subscribe("p", r)
    await app.subscribe("q", "b")
    await app.subscribe("q", "c")
    await app.notify_topic("news", "p", {"title": "hi"}, event_id="e1")
    await app.notify_topic("news", "q", {"title": "hi"}, event_id="e1")
    expander = _expander(app, batch=10)
    assert await expander.step()
    assert await expander.step()
    assert await _deliveries(app) == _each(["a", "b", "c"])
    event = (await app.topic_info("p") or pytest.fail("no topic")).recent[0]
    batch = await app.plan_topic_batch(event, ["a", "b"])
    results = await app.store.enqueue(batch.deliveries, now=app.clock.now())
    assert not any(r.created for r in results)
    assert {r.delivery.idempotency_key for r in results} == {
        default_key("e1", r, c) for r in ("a", "b") for c in ("email", "push")
    }


async def test_preferences_apply_to_a_topic_fan_out(make: App) -> None:
    """A subscriber who opted out of email gets a suppressed email delivery."""
    app = await make()
    await app.subscribe("p", "u1")
    await app.set_preferences(Preferences(recipient_id="u1", channels={"*:email": False}))
    await app.notify_topic("news", "p", {"title": "hi"}, event_id="e1")
    assert await _expander(app).step()
    page = await app.records(limit=10)
    status = {r[0].channel: r[0].status for r in page.records}
    assert status == {"email": DeliveryStatus.SUPPRESSED, "push": DeliveryStatus.PENDING}


async def test_a_burst_worker_expands_and_sends_a_topic_event(make: App) -> None:
    """``kirim worker --burst`` does not stop before a fan-out under way is done."""
    app = await make()
    for r in ("u1", "u2", "u3"):
        await app.subscribe("p", r)
    await app.notify_topic("news", "p", {"title": "hi"}, event_id="e1")
    await app.worker().run(burst=True)
    page = await app.records(limit=10)
    assert sorted((r[0].recipient, r[0].status) for r in page.records) == sorted(
        (r, DeliveryStatus.SENT) for r in ("u1", "u2", "u3") for _ in ("email", "push")
    )


async def _runs(app: Kirim) -> Counter[str]:
    """recipient -> how many runs it has."""
    return Counter(r.recipient_id for r in await app.store.list_runs(limit=500))


async def test_a_workflow_event_to_a_topic_starts_one_run_per_subscriber(make: App) -> None:
    """A workflow type's event to a topic fans out into one run per subscriber as of
    its mark (keyed as a direct event's), in batches; the runs take their steps."""
    app = await make()
    for r in ("u1", "u2", "u3", "u4", "u5"):
        await app.subscribe("p", r)
    event = await app.notify_topic("news_flow", "p", {"title": "hi"}, event_id="e1")
    assert event.created
    await app.unsubscribe("p", "u2")  # after the mark: still gets a run
    await app.subscribe("p", "u0")  # after the mark: gets none
    expander = _expander(app)
    joined: list[str] = []

    async def join_midway(event: TopicEvent, batch: Sequence[str]) -> None:
        if event.batches == 1:
            joined.append("u9")
            await app.subscribe("p", "u9")

    expander.before_batch = join_midway
    assert await expander.step()
    assert joined == ["u9"]
    everyone = ["u1", "u2", "u3", "u4", "u5"]
    assert await _runs(app) == Counter(everyone)
    runs = await app.store.list_runs(limit=10)
    assert {r.key for r in runs} == {run_key("news_flow", "e1", r) for r in everyone}
    assert {r.status for r in runs} == {RunStatus.WAITING}
    assert await _deliveries(app) == Counter()  # the runs make them, step by step
    (done,) = (await app.topic_info("p") or pytest.fail("no topic")).recent
    assert done.status is TopicEventStatus.DONE
    assert done.recipients == 5
    await app.worker().run_once()  # each run's first step: push
    assert await _deliveries(app) == Counter((r, "push") for r in everyone)


async def test_a_workflow_topic_event_starts_no_run_twice(make: App, clock) -> None:
    """A batch whose commit's answer was lost is not done again; a stale expander's late
    batch starts nothing; the event given again, or the same event id sent to a
    subscriber directly, starts no second run."""
    app = await make()
    for r in ("a", "b", "c", "d", "e"):
        await app.subscribe("p", r)
    await app.notify_topic("news_flow", "p", {"title": "hi"}, event_id="e1")
    store = app.store
    expand = store.expand_topic_batch
    seen: list[TopicEvent] = []

    class AnswerLost(Exception):
        pass

    async def lose_second_answer(event: TopicEvent, *args: object, **kwargs: object) -> object:
        seen.append(event)
        done = await expand(event, *args, **kwargs)  # type: ignore[arg-type]
        if len(seen) == 2:
            raise AnswerLost  # committed: the worker never heard
        return done

    store.expand_topic_batch = lose_second_answer  # type: ignore[method-assign]
    with pytest.raises(AnswerLost):
        await _expander(app, "w1").step()
    store.expand_topic_batch = expand  # type: ignore[method-assign]
    assert await _runs(app) == Counter(["a", "b", "c", "d"])
    clock.advance(LEASE + 1)
    taken = await store.claim_topic_event(worker_id="w2", now=clock.now(), lease=LEASE)
    assert taken is not None
    assert taken.cursor == "d"  # the lost answer's batch committed
    stale = seen[1]
    assert stale.lease_token is not None
    batch = await app.plan_topic_batch(stale, ["c", "d"])
    late = await store.expand_topic_batch(
        stale, stale.lease_token, ["c", "d"], batch, last=False, now=clock.now(), lease=LEASE
    )
    assert late is None
    clock.advance(LEASE + 1)  # w2 died too
    assert await _expander(app, "w3").step()
    assert await _runs(app) == Counter(["a", "b", "c", "d", "e"])
    again = await app.notify_topic("news_flow", "p", {"title": "hi"}, event_id="e1")
    assert not again.created
    assert not await _expander(app, "w4").step()
    direct = await app.notify_event("news_flow", ["c"], {"title": "hi"}, event_id="e1")
    assert [r.created for r in direct.runs] == [False]
    assert await _runs(app) == Counter(["a", "b", "c", "d", "e"])
