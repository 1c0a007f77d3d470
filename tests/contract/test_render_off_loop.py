"""Rendering an event's templates runs off the event loop, on both backends:
``notify_event``, ``notify_topic``'s check and each topic batch a worker plans
(``plan_topic_batch``) render in a thread, so a heavy template or a batch of 500
subscribers never stalls what else the loop runs (a worker's sends, its heartbeats)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.notify import fanout
from kirim.notify.types import parse_type
from kirim.testing import FlakyProvider, ManualClock

SHIPPED = parse_type("shipped", {"templates": {"push": {"title": "Order {{ n }}"}}})
TRACKED = parse_type(
    "tracked",
    {"templates": {"push": {"title": "Order {{ n }}"}}, "steps": [{"send": "push"}]},
)


@pytest.fixture
async def app(database_url: str, clock: ManualClock) -> Any:
    channels = {"push": Channel(name="push", provider=FlakyProvider())}
    kirim = Kirim(
        Config(database=database_url), channels=channels, clock=clock, types=[SHIPPED, TRACKED]
    )
    await kirim.open(migrate=True)
    yield kirim
    await kirim.close()


@pytest.fixture
def rendered_on(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread of each event's rendering (``fanout.prepare``)."""
    seen: list[int] = []
    prepare = fanout.prepare

    def watched(*args: Any, **kwargs: Any) -> Any:
        seen.append(threading.get_ident())
        return prepare(*args, **kwargs)

    monkeypatch.setattr(fanout, "prepare", watched)
    return seen


async def test_notify_event_renders_off_the_loop(app: Kirim, rendered_on: list[int]) -> None:
    done = await app.notify_event("shipped", ["u1", "u2"], {"n": 1}, event_id="e1")
    assert len(done.deliveries) == 2
    assert rendered_on
    assert threading.get_ident() not in rendered_on


async def test_a_topic_event_and_its_batches_render_off_the_loop(
    app: Kirim, rendered_on: list[int]
) -> None:
    await app.subscribe("project:1", "u1")
    await app.notify_topic("shipped", "project:1", {"n": 1}, event_id="e1")
    (event,) = await app.store.latest_topic_events(limit=1)
    batch = await app.plan_topic_batch(event, ["u1"])
    assert [it.recipient_id for it in batch.deliveries] == ["u1"]
    assert len(rendered_on) == 2
    assert threading.get_ident() not in rendered_on


async def test_a_workflow_topic_batch_renders_its_runs_off_the_loop(
    app: Kirim, rendered_on: list[int]
) -> None:
    """A workflow type's batch plans its runs (every send step's message) in a thread."""
    await app.subscribe("project:1", "u1")
    await app.notify_topic("tracked", "project:1", {"n": 1}, event_id="e1")
    (event,) = await app.store.latest_topic_events(limit=1)
    batch = await app.plan_topic_batch(event, ["u1", "u2"])
    assert [r.recipient_id for r in batch.runs] == ["u1", "u2"]
    assert batch.deliveries == ()
    assert len(rendered_on) == 2
    assert threading.get_ident() not in rendered_on
