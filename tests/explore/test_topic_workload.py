"""The topic workload of the explorer: its worlds, and its invariant can fail."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import kirim.store.topics
from kirim.explore.scenario import Settings, run_schedule
from kirim.explore.topics import CANCELS, COUNTS, FLOW, NAME, RUNS, STOP, TopicCancel, TopicSend
from kirim.explore.world import World
from kirim.store.event_writes import TopicBatch, Written
from kirim.store.sequence import Operation, Query
from kirim.topics import TopicCounts, TopicEvent
from kirim.worker.topics import TopicExpander

#: the worlds with a topic workload among the first seeds
TOPIC_SEEDS = [s for s in range(400) if World.draw(s).topics is not None]
#: those whose topic events include some of a workflow type
FLOW_SEEDS = [s for s in TOPIC_SEEDS if (t := World.draw(s).topics) and t.flow is not None]


def _caught(seeds: list[int], name: str = NAME) -> int | None:
    for seed in seeds:
        outcome = run_schedule(Settings.draw(seed, workload="full"))
        if any(v.name == name for v in outcome.violations):
            return seed
    return None


def test_some_worlds_draw_topics_with_changes_and_retries() -> None:
    """Among the first seeds some worlds fan out to topics, with subscriptions changing
    during a run, an event given again, and batches of one to three."""
    plans = [World.draw(s).topics for s in TOPIC_SEEDS]
    assert len(plans) > 50
    steps = [step for p in plans if p is not None for step in p.steps]
    assert any(isinstance(s, TopicSend) and s.again for s in steps)
    assert any(not isinstance(s, TopicSend) and not s.on and s.at >= 0 for s in steps)
    assert {p.batch for p in plans if p is not None} == {1, 2, 3}


def test_some_topic_worlds_send_a_workflow_type() -> None:
    """Some topic worlds draw a workflow type of their own, with steps on the world's
    channels, and send some of their topic events (retried ones too) of it."""
    assert len(FLOW_SEEDS) > 20
    plans = [World.draw(s).topics for s in FLOW_SEEDS]
    sends = [s for p in plans if p is not None for s in p.steps if isinstance(s, TopicSend)]
    assert any(s.type == FLOW and s.again for s in sends)
    assert any(s.type != FLOW for s in sends)
    world = World.draw(FLOW_SEEDS[0])
    assert world.notification_type(FLOW).steps


def test_the_workflow_topic_worlds_hold() -> None:
    """Over a budget of worlds whose topic events start runs no invariant fails."""
    failing = {}
    for seed in FLOW_SEEDS[:15]:
        outcome = run_schedule(Settings.draw(seed, workload="full"))
        if outcome.violations:
            failing[seed] = [str(v) for v in outcome.violations][:2]
    assert failing == {}


def test_mutation_runs_started_after_the_batchs_progress_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An expander that commits a batch's progress and then starts its runs in a
    transaction of their own (a crash, or a lost answer, between the two loses them)
    is caught (``topic_runs_exactly_once``) within 200 seeds."""
    original = TopicExpander._record

    async def split(
        self: TopicExpander,
        event: TopicEvent,
        token: str,
        recipients: Any,
        items: TopicBatch,
        *,
        last: bool,
    ) -> Written | None:
        bare = replace(items, runs=())
        written = await original(self, event, token, recipients, bare, last=last)
        if written is None or not items.runs:
            return written
        started = await self.store.start_runs(items.runs, now=self.clock.now())  # type: ignore[attr-defined]
        return replace(written, runs=tuple(started))

    monkeypatch.setattr(TopicExpander, "_record", split)
    assert _caught([s for s in FLOW_SEEDS if s < 200], RUNS) is not None


def test_the_topic_worlds_hold() -> None:
    """Over a budget of topic worlds no invariant fails (crashes, store faults on the
    batches and retried events included)."""
    failing = {}
    for seed in TOPIC_SEEDS[:25]:
        outcome = run_schedule(Settings.draw(seed, workload="full"))
        if outcome.violations:
            failing[seed] = [str(v) for v in outcome.violations][:2]
    assert failing == {}


def test_mutation_fan_out_ignores_the_mark_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fan-out that reads the subscribers as they are now, not at its mark, is caught
    within 200 seeds."""
    original = kirim.store.topics.batch_of

    def live_now(event: TopicEvent, limit: int) -> Operation[list[str]]:
        args = {"topic": event.topic, "after": event.cursor or "", "limit": limit}
        rows = yield Query("subscribers_now", args)
        return [str(r["recipient_id"]) for r in rows]

    monkeypatch.setattr(kirim.store.topics, "batch_of", live_now)
    assert original is not live_now
    assert _caught([s for s in TOPIC_SEEDS if s < 200]) is not None


def test_mutation_fan_out_done_after_its_first_batch_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fan-out that calls itself done after its first batch (the rest of its
    subscribers lost) is caught within 200 seeds."""
    original = kirim.store.topics.expand_batch

    def done_early(*args: Any, last: bool, **kwargs: Any) -> Any:
        return original(*args, last=True, **kwargs)

    monkeypatch.setattr(kirim.store.topics, "expand_batch", done_early)
    assert _caught([s for s in TOPIC_SEEDS if s < 200]) is not None


def test_mutation_topic_counts_miss_topics_without_subscribers_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counts an operator is shown (``kirim status``, the dashboard) that leave out a
    topic whose subscribers all left, or one only sent to, are caught
    (``topic_counts_true``) within 200 seeds."""
    original = kirim.store.topics.counts

    def lying() -> Operation[TopicCounts]:
        got = yield from original()
        rows = yield Query("list_topics", {"limit": 10_000})
        return replace(got, topics=sum(1 for r in rows if int(r["subscribers"]) > 0))

    monkeypatch.setattr(kirim.store.topics, "counts", lying)
    for seed in [s for s in TOPIC_SEEDS if s < 200]:
        outcome = run_schedule(Settings.draw(seed, workload="full"))
        if any(v.name == COUNTS for v in outcome.violations):
            return
    pytest.fail("topic counts that miss topics were not caught within 200 seeds")


#: the workflow topic worlds whose type a ``STOP`` event cancels, near one of its events
CANCEL_SEEDS = [
    s
    for s in FLOW_SEEDS
    if (t := World.draw(s).topics) and any(isinstance(x, TopicCancel) for x in t.steps)
]


def test_some_workflow_topic_worlds_cancel_during_a_fan_out() -> None:
    """Some workflow topic worlds draw a cancellation of the type's runs (``cancel_on``)
    near one of its topic events; the type then names it."""
    assert len(CANCEL_SEEDS) > 5
    world = World.draw(CANCEL_SEEDS[0])
    assert world.notification_type(FLOW).cancel_on == (STOP,)


def test_the_cancelled_workflow_topic_worlds_hold() -> None:
    """Over those worlds no invariant fails: a cancellation reaches the runs of the
    fan-out's later batches too."""
    failing = {}
    for seed in CANCEL_SEEDS[:12]:
        outcome = run_schedule(Settings.draw(seed, workload="full"))
        if outcome.violations:
            failing[seed] = [str(v) for v in outcome.violations][:2]
    assert failing == {}


def test_mutation_a_batch_ignores_the_fan_outs_cancellation_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fan-out whose later batches start their runs as if no cancellation had
    reached it (the defect of the first topic runs) is caught
    (``topic_cancel_honored``) within 200 seeds."""
    original = kirim.store.topics.batch

    def heedless(items: TopicBatch, given: float, *, canceled: str | None = None) -> Any:
        return original(items, given)

    monkeypatch.setattr(kirim.store.topics, "batch", heedless)
    assert _caught([s for s in CANCEL_SEEDS if s < 200], CANCELS) is not None
