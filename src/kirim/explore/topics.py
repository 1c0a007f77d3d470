"""Topics in a ``full`` schedule: a topic workload drawn per seed, its driver and its
invariant (docs/topics.md).

``draw`` (from a generator of its own, so the rest of a seed's world stays as it
was) gives some worlds a topic plan: subscribers (the world's recipients and a few of
the topic's own), subscribe and unsubscribe steps at seeded times, before, between
and during the fan-outs, and events of a type without a digest to a topic, some given
again later (a retried topic event). The workers expand in small batches (1 to 3
subscribers), paced by a virtual delay before each batch is planned, so that crashes,
stalls and the fault plan's ``expand_topic_batch`` store faults (``faults``: failing
before the commit, or committing and losing the answer) land in the middle of a
fan-out. Half of the topic worlds also draw a workflow type of their own (``FLOW``:
one send step per channel it has, perhaps a short delay between), and some of their
topic events are of it (from a third generator, so the plain draws stay as they were):
those fan out into runs, one per subscriber, started with each batch's progress.

The driver is sequential: each step's call returns before the next begins, so its own
model of who is subscribed when an event's ``notify_topic`` returns is the set as of
the event's commit (``TopicTruth``).

``topic_fanout_exactly_once`` judges the ledger after the run:

- every recipient subscribed as of a topic event's commit has a delivery of it on
  each of the type's channels (a suppressed one counts: preferences are judged by
  the other invariants), and nobody else has any (one who subscribed after the
  commit, during the fan-out, gets none; one who unsubscribed after it still gets
  it): a fan-out still unfinished at the end is a loss;
- no (event, recipient, channel, address) has two deliveries (a batch done twice
  adds nothing);
- an event given again is answered with the event first recorded, not created.

``topic_runs_exactly_once`` judges a workflow type's topic events: every recipient
subscribed as of the commit has exactly one run of the event (``run_key(type,
event_id, recipient)``, every run ever started counted: the run audit keeps those
retention pruned), and nobody else has one, whatever crashed mid-fan-out, lost a
batch's answer or gave the event again; the runs' send steps are then judged as every
topic event's deliveries (above), but a canceled run's (below).

``topic_cancel_honored`` judges the worlds whose workflow type a ``STOP`` event
cancels (half of them; ``cancel_key = "topic"``), one drawn near one of its topic
events (before its fan-out's first batch, during it, or after it is done): every run
of a topic event recorded before the cancellation with its value, read right after
the cancellation returned and again at the end, is canceled, unless it was over
already then, and takes no step after it. A run the fan-out started after the
cancellation (a later batch) is canceled and took no step at all.

``topic_counts_true`` judges what an operator is shown (``kirim status``, the
dashboard's topics page: ``Store.topic_counts``) once every fan-out is done: as many
topics as the driver touched (subscribed to, or sent to), as many live subscriptions
as its model holds, every topic event done (but those retention pruned) and none
pending or expanding.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kirim.explore.faults import Fault
from kirim.explore.invariants import Ledger, Violation
from kirim.topics import TopicCounts

NAME = "topic_fanout_exactly_once"
RUNS = "topic_runs_exactly_once"
COUNTS = "topic_counts_true"
TOPICS = ("project:1", "project:2")
CANCELS = "topic_cancel_honored"
#: the name of a topic world's workflow type (``TopicsPlan.flow``)
FLOW = "topic_flow"
#: the event that cancels its runs (its ``cancel_on``; its ``cancel_key`` is ``topic``)
STOP = "topic_flow_stop"


@dataclass(frozen=True, slots=True, kw_only=True)
class SubStep:
    """The driver subscribes (``on``) or unsubscribes ``recipient`` at ``at``."""

    at: float
    topic: str
    recipient: str
    on: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicSend:
    """The application's ``notify_topic`` at ``at`` (``again``: a retry of an event
    given before)."""

    at: float
    topic: str
    type: str
    event_id: str
    data: dict[str, Any]
    again: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicCancel:
    """The application's ``cancel_by_event(STOP, {"topic": value})`` at ``at``: it
    cancels the runs of ``FLOW`` whose event's ``topic`` is ``value``."""

    at: float
    value: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicsPlan:
    """A world's topic workload."""

    subscribers: tuple[str, ...]
    steps: tuple[SubStep | TopicSend | TopicCancel, ...]
    #: subscribers per batch, and virtual seconds before each batch's commit
    batch: int
    pace: float
    #: the table of the world's workflow type ``FLOW`` (None: it has none)
    flow: dict[str, Any] | None = None

    def deliveries(self, channels: int) -> int:
        """At most how many deliveries the fan-outs make (for the run's bounds)."""
        events = sum(1 for s in self.steps if isinstance(s, TopicSend) and not s.again)
        return events * len(self.subscribers) * channels


def draw(seed: int, types: Sequence[Any], people: Sequence[str]) -> TopicsPlan | None:
    """The topic workload of a world, or None (most worlds, and those whose types all
    digest: a digest's delivery gathers several events, judged by the digest checks)."""
    rng = random.Random(f"world:{seed}:topics")
    plain = [t.name for t in types if "digest" not in t.table]
    if not plain or rng.random() < 0.6:
        return None
    own = tuple(f"t{i}" for i in range(1, rng.randint(2, 6) + 1))
    subscribers = tuple(people) + own
    steps: list[SubStep | TopicSend] = []
    for who in subscribers:
        if rng.random() < 0.7:
            steps.append(SubStep(at=-1.0, topic=TOPICS[0], recipient=who, on=True))
        if rng.random() < 0.3:
            steps.append(SubStep(at=-1.0, topic=TOPICS[1], recipient=who, on=True))
    sends: list[TopicSend] = []
    for i in range(1, rng.randint(1, 3) + 1):
        sends.append(
            TopicSend(
                at=rng.uniform(0.0, 20.0),
                topic=rng.choice(TOPICS),
                type=rng.choice(plain),
                event_id=f"tev{i}",
                data={"n": 100 + i, "topic": rng.choice(("a", "b"))},
            )
        )
    for _ in range(rng.randint(2, 8)):  # changes around and during the fan-outs
        near = rng.choice(sends).at + rng.uniform(-2.0, 6.0)
        steps.append(
            SubStep(
                at=max(0.0, near),
                topic=rng.choice(TOPICS),
                recipient=rng.choice(subscribers),
                on=rng.random() < 0.5,
            )
        )
    if rng.random() < 0.5:
        first = rng.choice(sends)
        sends.append(
            TopicSend(
                at=first.at + rng.uniform(0.5, 15.0),
                topic=first.topic,
                type=first.type,
                event_id=first.event_id,
                data=first.data,
                again=True,
            )
        )
    steps += sends
    plan = TopicsPlan(
        subscribers=subscribers,
        steps=tuple(sorted(steps, key=lambda s: s.at)),
        batch=rng.choice((1, 2, 3)),
        pace=rng.choice((0.0, 0.5, 2.0)),
    )
    return _with_flow(seed, plan, types)


def _with_flow(seed: int, plan: TopicsPlan, types: Sequence[Any]) -> TopicsPlan:
    """Half of the topic worlds: a workflow type ``FLOW`` on some of the world's
    channels (a send step on each, perhaps a delay of a few seconds after the first),
    and some of the topic events of it (one at least; an event given again keeps the
    type of its first)."""
    rng = random.Random(f"world:{seed}:topic_flows")
    if rng.random() < 0.5:
        return plan
    channels = sorted({ch for t in types for ch in t.table["templates"]})
    on = rng.sample(channels, rng.randint(1, len(channels)))
    steps: list[dict[str, Any]] = [{"send": ch} for ch in on]
    if rng.random() < 0.5:
        steps.insert(1, {"delay": f"{rng.choice((1, 3))}s"})
    table = {"templates": {ch: {"title": f"{FLOW} {{{{ n }}}}"} for ch in on}, "steps": steps}
    firsts = [s.event_id for s in plan.steps if isinstance(s, TopicSend) and not s.again]
    chosen = {rng.choice(firsts)} | {e for e in firsts if rng.random() < 0.5}
    out = tuple(
        replace(s, type=FLOW) if isinstance(s, TopicSend) and s.event_id in chosen else s
        for s in plan.steps
    )
    return _with_cancel(seed, replace(plan, steps=out, flow=table))


def _with_cancel(seed: int, plan: TopicsPlan) -> TopicsPlan:
    """Half of the workflow topic worlds: ``FLOW`` is canceled by ``STOP`` events
    (``cancel_key = "topic"``), and one comes at a seeded time near one of its topic
    events: before its fan-out's first batch, during it, or after it is done."""
    rng = random.Random(f"world:{seed}:topic_cancels")
    if plan.flow is None or rng.random() < 0.5:
        return plan
    flows = [s for s in plan.steps if isinstance(s, TopicSend) and s.type == FLOW]
    target = rng.choice(flows)
    at = target.at + rng.uniform(0.0, 3.0 * plan.pace + 1.0)
    cancel = TopicCancel(at=at, value=str(target.data["topic"]))
    table = {**plan.flow, "cancel_on": [STOP], "cancel_key": "topic"}
    steps = tuple(sorted((*plan.steps, cancel), key=lambda s: s.at))
    return replace(plan, steps=steps, flow=table)


def faults(seed: int, plan: TopicsPlan | None, *, hosts: Sequence[str]) -> list[Fault]:
    """Faults aimed at the fan-outs: a worker killed while one runs, and a batch's
    store call failing before its commit or after it (the answer lost)."""
    if plan is None:
        return []
    rng = random.Random(f"plan:{seed}:topics")
    sends = [s for s in plan.steps if isinstance(s, TopicSend)]
    out: list[Fault] = []
    if rng.random() < 0.5:
        at = rng.choice(sends).at + rng.uniform(0.0, 3.0 * plan.pace + 1.0)
        out.append(Fault(kind="crash", host=rng.choice(list(hosts)), at=at))
    if rng.random() < 0.6:
        out.append(
            Fault(
                kind="store",
                host=rng.choice(list(hosts)),
                at=rng.choice(sends).at,
                method="expand_topic_batch",
                nth=rng.randint(1, 3),
                mode=rng.choice(("fail", "ack_lost")),
            )
        )
    return out


@dataclass(slots=True)
class EventRecord:
    """One ``notify_topic`` of the driver and what it expected."""

    step: TopicSend
    #: who was subscribed to its topic when it returned (the driver's own model)
    expected: frozenset[str]
    id: int
    created: bool


@dataclass(frozen=True, slots=True)
class RunSeen:
    """A run of a ``FLOW`` topic event as the driver read it: its status and how many
    steps it had recorded."""

    id: int
    event_id: str
    recipient: str
    status: str
    steps: int


@dataclass(slots=True)
class CancelRecord:
    """One ``TopicCancel`` of the driver: the value it canceled, the ``FLOW`` topic
    events recorded before it with that value, and their runs as the driver read them
    right after it returned (``after``) and at the end (``end``)."""

    step: TopicCancel
    events: frozenset[str]
    after: dict[int, RunSeen]
    end: dict[int, RunSeen] = field(default_factory=dict)


@dataclass(slots=True)
class TopicTruth:
    events: list[EventRecord] = field(default_factory=list)
    cancels: list[CancelRecord] = field(default_factory=list)
    #: the topics the driver subscribed to or sent to (each has its row)
    touched: set[str] = field(default_factory=set)
    #: what ``Store.topic_counts`` said once every fan-out was done, and the driver's
    #: model of the live subscriptions then (None: the run ended first)
    counts: TopicCounts | None = None
    live: int = 0
    #: the ids of the topic events the store still held then (a done event older than
    #: the retention's ``keep`` is pruned: the operator is shown it no more)
    present: set[int] = field(default_factory=set)


class TopicDriver:
    """Runs a world's topic steps through the engine's verbs, keeping ``TopicTruth``."""

    def __init__(self, plan: TopicsPlan, note: Callable[..., None]) -> None:
        self.plan = plan
        self.truth = TopicTruth()
        self.note = note
        self.model: dict[str, set[str]] = {t: set() for t in TOPICS}

    async def step(self, app: Any, step: SubStep | TopicSend | TopicCancel) -> None:
        if isinstance(step, TopicCancel):
            await self._cancel(app, step)
            return
        if isinstance(step, SubStep):
            if step.on:
                await app.subscribe(step.topic, step.recipient)
                self.model[step.topic].add(step.recipient)
                self.truth.touched.add(step.topic)
            else:
                await app.unsubscribe(step.topic, step.recipient)
                self.model[step.topic].discard(step.recipient)
            verb = "subscribe" if step.on else "unsubscribe"
            self.note(f"topic_{verb} {step.topic} {step.recipient}", host="S")
            return
        event = await app.notify_topic(
            step.type, step.topic, dict(step.data), event_id=step.event_id
        )
        expected = frozenset(self.model[step.topic])
        self.truth.touched.add(step.topic)
        self.truth.events.append(
            EventRecord(step=step, expected=expected, id=event.id, created=event.created)
        )
        self.note(
            f"topic_event {step.topic} {step.event_id} id={event.id} mark={event.mark} "
            f"created={event.created} expected={','.join(sorted(expected))}",
            host="S",
        )

    async def _cancel(self, app: Any, step: TopicCancel) -> None:
        """``cancel_by_event`` of ``STOP``, and the runs of the topic events it names as
        they are once it returned."""
        events = frozenset(
            r.step.event_id
            for r in self.truth.events
            if r.step.type == FLOW and str(r.step.data.get("topic")) == step.value
        )
        done = await app.cancel_by_event(STOP, {"topic": step.value})
        after = await _runs_of(app, events)
        self.truth.cancels.append(CancelRecord(step=step, events=events, after=after))
        self.note(
            f"topic_cancel topic={step.value} events={','.join(sorted(events))} "
            f"canceled={','.join(str(c.run.id) for c in done)} runs_then={len(after)}",
            host="S",
        )

    async def wait_done(self, app: Any) -> None:
        """Until every fan-out is done, and every run it started is past its steps
        (the run's bound judges one that never is)."""
        while await app.store.topic_events_expanding():  # noqa: ASYNC110 (polls the store)
            await asyncio.sleep(1.0)
        while self.plan.flow is not None and (await app.store.run_counts()).get("waiting"):  # noqa: ASYNC110
            await asyncio.sleep(1.0)
        for c in self.truth.cancels:
            c.end = await _runs_of(app, c.events)
        self.truth.counts = await app.store.topic_counts()
        self.truth.live = sum(len(m) for m in self.model.values())
        held = await app.store.latest_topic_events(limit=10_000)
        self.truth.present = {e.id for e in held}


async def _runs_of(app: Any, events: Collection[str]) -> dict[int, RunSeen]:
    """The runs of ``FLOW`` of these events (a pruned run is not read)."""
    out: dict[int, RunSeen] = {}
    for listed in await app.store.list_runs(limit=100_000):
        if listed.type != FLOW or listed.event_id not in events:
            continue
        run = await app.store.get_run(listed.id)
        if run is None:
            continue
        out[run.id] = RunSeen(
            id=run.id,
            event_id=run.event_id,
            recipient=run.recipient_id,
            status=str(run.status),
            steps=len(run.recorded),
        )
    return out


def pace(plan: TopicsPlan) -> Callable[[Any, Sequence[str]], Any]:
    """The expander's hook for each batch read, before it is planned (its recipients'
    preferences read) and recorded: a virtual delay, so that the fan-out spans the
    changes of subscriptions and the faults around it (``liveness`` judges a
    deferral by the preferences in force from its delivery's commit: the planning
    stays right before the commit, as ``notify_event``'s)."""

    async def wait(event: Any, batch: Sequence[str]) -> None:
        if plan.pace:
            await asyncio.sleep(plan.pace)

    return wait


def check_topics(
    ledger: Ledger,
    truth: TopicTruth,
    channels_of: Callable[[str], Sequence[str]],
    flows: Collection[str] = (),
) -> list[Violation]:
    """``topic_fanout_exactly_once`` and ``topic_runs_exactly_once`` (the module's
    text). ``channels_of``: a type's channels; ``flows``: the workflow types."""
    out: list[Violation] = []
    firsts: dict[tuple[str, str, str], EventRecord] = {}
    for record in truth.events:
        s = record.step
        key = (s.type, s.event_id, s.topic)
        first = firsts.get(key)
        if first is None:
            firsts[key] = record
            if not record.created:
                out.append(
                    Violation(
                        name=NAME, delivery=None, detail=f"{s.event_id} to {s.topic}: not created"
                    )
                )
        elif record.created or record.id != first.id:
            out.append(
                Violation(
                    name=NAME,
                    delivery=None,
                    detail=f"{s.event_id} to {s.topic} given again made another",
                )
            )
    # the runs a cancellation named that ended canceled, or that an operator's prune
    # took once over (a done one's deliveries stay in the ledger: judged as others)
    stopped = {
        (r.event_id, r.recipient)
        for c in truth.cancels
        for r in c.end.values()
        if r.status == "canceled"
    }
    seen = {(r.event_id, r.recipient) for c in truth.cancels for r in c.end.values()}
    named = {e for c in truth.cancels for e in c.events}
    stopped |= {
        (str(r["event_id"]), str(r["recipient_id"]))
        for r in ledger.runs
        if r["type"] == FLOW and r["event_id"] in named
    } - seen
    by_event: dict[str, list[dict[str, Any]]] = {}
    for d in ledger.deliveries:
        by_event.setdefault(str(d["event_id"]), []).append(d)
    for (type_name, event_id, topic), record in firsts.items():
        rows = by_event.get(event_id, [])
        twice = Counter((d["recipient_id"], d["channel"], d["recipient"]) for d in rows)
        for (who, channel, address), n in sorted(twice.items()):
            if n > 1:
                out.append(
                    Violation(
                        name=NAME,
                        delivery=None,
                        detail=f"{event_id}: {n} deliveries to {who} {channel} {address}",
                    )
                )
        got = {(d["recipient_id"], d["channel"]) for d in rows}
        want = {(r, c) for r in record.expected for c in channels_of(type_name)}
        for who, channel in sorted(want - got):
            if (event_id, who) in stopped:  # its run canceled: judged by _cancels
                continue
            out.append(
                Violation(
                    name=NAME,
                    delivery=None,
                    detail=f"{event_id} to {topic}: {who} subscribed, no {channel} delivery",
                )
            )
        for who, channel in sorted(got - want):
            out.append(
                Violation(
                    name=NAME,
                    delivery=None,
                    detail=f"{event_id} to {topic}: {who} not subscribed, got {channel}",
                )
            )
    out += _runs(ledger, [(k, r) for k, r in firsts.items() if k[0] in flows])
    out += _cancels(truth)
    out += _counts(truth, sum(r.id in truth.present for r in firsts.values()))
    return out


def _runs(
    ledger: Ledger, events: Sequence[tuple[tuple[str, str, str], EventRecord]]
) -> list[Violation]:
    """``topic_runs_exactly_once`` (the module's text) over the workflow type's topic
    events: each (type, event id, topic) with its first record."""
    started = Counter((r["type"], r["event_id"], r["recipient_id"]) for r in ledger.runs)
    out: list[Violation] = []
    for (type_name, event_id, topic), record in events:
        mine = {who: n for (t, e, who), n in started.items() if (t, e) == (type_name, event_id)}
        for who in sorted(record.expected | set(mine)):
            n = mine.get(who, 0)
            want = 1 if who in record.expected else 0
            if n == want:
                continue
            why = "subscribed" if want else "not subscribed"
            out.append(
                Violation(
                    name=RUNS,
                    delivery=None,
                    detail=f"{event_id} to {topic}: {who} {why}, {n} runs of it",
                )
            )
    return out


def _cancels(truth: TopicTruth) -> list[Violation]:
    """``topic_cancel_honored`` (the module's text): nothing of a canceled ``FLOW``
    topic event is done after the cancellation."""
    out: list[Violation] = []
    for c in truth.cancels:
        if not c.end and not c.after:
            continue
        for run_id, end in sorted(c.end.items()):
            then = c.after.get(run_id)
            tag = f"{end.event_id} to {end.recipient} (run {run_id}, canceled at {c.step.at:.2f})"
            over_then = then is not None and then.status != "waiting"
            if end.status != "canceled" and not over_then:
                out.append(Violation(name=CANCELS, delivery=None, detail=f"{tag}: {end.status}"))
            taken = then.steps if then is not None else 0
            if end.steps > taken:
                detail = f"{tag}: {end.steps - taken} steps taken after the cancellation"
                out.append(Violation(name=CANCELS, delivery=None, detail=detail))
    return out


def _counts(truth: TopicTruth, events: int) -> list[Violation]:
    """``topic_counts_true`` (the module's text); ``events``: the distinct events the
    store still holds (a pruned one is not shown)."""
    got = truth.counts
    if got is None:
        return []
    want = TopicCounts(
        topics=len(truth.touched), subscriptions=truth.live, pending=0, expanding=0, done=events
    )
    if got == want:
        return []
    detail = f"the operator is shown {got.to_json()}, the truth is {want.to_json()}"
    return [Violation(name=COUNTS, delivery=None, detail=detail)]
