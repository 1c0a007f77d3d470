"""The workflow workload (``kirim explore --workload flows``): seeded worlds of
workflow runs (``kirim.runs``) on a real store, driven through steps, delays,
branches on the inbox's read state and on a step's delivery, worker crashes (a run
claimed and abandoned), stalled workers that come back with a lost claim,
cancellations by event and by an operator (some of them from inside the very request
they race), and the promise checked against the ledger and what the providers were
asked:

- ``step_once``: each step's delivery at most once per run (the provider saw one
  request per step key, or the channel chose at least once);
- ``one_path``: the recorded steps are one path through the steps: never both ways
  of a branch, each branch recorded, each step passed over recorded ``skipped``;
- ``decided_right``: a branch on read/seen says what the feed said when it decided;
- ``after_cancel``: nothing made after a committed cancellation, and nothing sent
  after it unless the cancellation named the delivery (in flight, or held);
- ``cancel_atomic``: an ``order_done`` event (``cancel_via``: recorded as such, by a
  process that dies right after its first commit, posted to ``/v1/events`` by a
  server that dies right after recording it, or sent to a topic by a process that
  dies right after recording it) is never committed without the
  cancellation of the run it cancels; given again it makes nothing twice, and a
  replayed request's kept answer names the run;
- ``delay_end``: a delay's recorded end is its start plus its duration, or for a
  delay until a time of the recipient's day the first instant from its start at
  which the recipient's clock read that time (their zone as it was when the step
  started, else the step's, else UTC; read by brute force, ``explore.localtime``),
  DST edges included; no later step was taken, and no later send asked of a
  provider, before it;
- ``liveness``: once every worker has run with time enough, every run is over,
  unless it waits, as chosen, on a step in doubt (``on_doubt = "wait"``: reported);
  a run past a delay took its next step;
- ``prune_over``: an operator's prune (``kirim prune``, drawn mid-scenario with no
  retention to speak of) takes only runs that were over (done or canceled, nothing
  due), and only once none of their deliveries is kept;
- ``prune_replay``: the event of a pruned run given again starts nothing (its key's
  tombstone), and a pruned run is checked as it was when it went.

A world plays on a fresh SQLite file, or (``run_seeds(database=...)``, ``kirim explore
--workload flows --database postgresql://…``) on a throw-away PostgreSQL database
copied from a migrated template (``kirim.explore.pglane.PostgresDatabase``). Worlds
worth keeping (one that once failed, one that reaches an edge) are saved as their
drawn values (``FlowWorld.to_json``, tests/explore/seeds/flows/), so they play the
same world however ``draw`` changes.

``FLOW_KNOBS`` names what a world draws; ``tests/explore/test_flows.py`` checks each
takes more than one value over its seeds, and the mutation checks (the branch record
skipped) are caught within 200 seeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import time, timedelta
from pathlib import Path
from typing import Any

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.errors import AmbiguousFailure, NotFound, PermanentFailure
from kirim.explore import flow_digests, localtime
from kirim.model import DeliveryStatus, OnUnknown
from kirim.notify.steps import Branch, Delay, Send, UnreadableStep
from kirim.notify.types import NotificationType, parse_type
from kirim.preferences import Preferences
from kirim.providers.base import Message, Sent
from kirim.providers.inbox import InboxProvider
from kirim.runs import Run, RunClaim, RunStatus, StepOutcome, StepState, in_doubt, step_key
from kirim.store.flows import Canceled
from kirim.worker import WorkerSettings

LEASE = 30.0
SETTINGS = WorkerSettings(lease=LEASE, backoff_base=1.0, backoff_max=2.0)
CONDITIONS = ("unread", "read", "seen", "unseen", "sent", "failed", "in_doubt", "data")
ACTIONS = (
    "tick",
    "tick",
    "tick",
    "wait",
    "read",
    "seen",
    "cancel_event",
    "cancel_run",
    "crash",
    "stall",
    "resume",
    "move",
    "prune",
)
#: the zones a recipient (or an until-delay's step) names; None: none
ZONES = (None, "Europe/Berlin", "America/New_York")
#: times of day an until-delay waits for: 02:30 is skipped in spring and repeated in
#: autumn in Berlin, skipped in spring in New York; 01:30 is repeated in New York
UNTIL = ("09:00", "02:30", "01:30")
START = 1_800_000_000.0
#: where a world's clock starts: an ordinary day, or the evening before the clocks
#: change (2027: Berlin 28 March and 31 October, New York 14 March and 7 November)
STARTS = (
    START,
    1_806_177_600.0,  # 2027-03-27 20:00 UTC
    1_804_968_000.0,  # 2027-03-13 20:00 UTC
    1_824_926_400.0,  # 2027-10-30 20:00 UTC
    1_825_531_200.0,  # 2027-11-06 20:00 UTC
)
#: the operator's prune: every finished row goes at once; keys are kept long
PRUNE_KEEP, PRUNE_KEYS = 0.0, 365 * 86_400.0


class Clock:
    """The world's one time line (every worker's and the store's)."""

    def __init__(self, start: float = START) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)


class Provider:
    """A provider model: each request's behaviour from a script (then ``ok``); it
    counts what the user received per key, and when each request came."""

    def __init__(self, clock: Clock, script: list[str]) -> None:
        self.idempotent = False
        self.clock = clock
        self.script = list(script)
        self.received: dict[str, int] = {}
        self.at: dict[str, list[float]] = {}
        #: each request's payload (a digest world reads what its sends carried)
        self.payloads: list[dict[str, Any]] = []
        self.on_request: Callable[[Message], Any] | None = None

    async def send(self, message: Message) -> Sent:
        key = message.idempotency_key
        self.at.setdefault(key, []).append(self.clock.now())
        payload = message.payload
        if isinstance(payload, str):
            payload = json.loads(payload)
        self.payloads.append(dict(payload) if isinstance(payload, Mapping) else {})
        if self.on_request is not None:
            await self.on_request(message)
        behaviour = self.script.pop(0) if self.script else "ok"
        if behaviour == "permanent":
            raise PermanentFailure("refused", status_code=400)
        self.received[key] = self.received.get(key, 0) + 1
        if behaviour == "lost":
            raise AmbiguousFailure("timeout after the request was written")
        return Sent(provider_message_id=f"p-{message.delivery_id}-{message.attempt}")


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowWorld:
    seed: int
    first: str  # the channel of the first send (inbox or email)
    delay: float
    condition: str
    on_doubt: str
    with_else: bool
    cancel_on: bool
    on_unknown: OnUnknown
    script: tuple[str, ...]
    recipients: int
    race_cancel: bool  # a cancellation from inside a request it races
    actions: tuple[tuple[str, int], ...] = field(default=())
    #: how a cancel_event comes: the library's cancel_by_event, an ``order_done`` event
    #: (its cancellations in its transaction), or such an event whose process dies
    #: right after its first commit
    cancel_via: str = "library"
    #: a delay until this time of the recipient's day instead of ``delay`` (None: not)
    until: str | None = None
    until_zone: str | None = None  # the step's zone, for recipients without one
    zones: tuple[str | None, ...] = ()  # each recipient's zone (None: no preferences)
    start: float = START
    #: a run a newer kirim recorded (a step kind this one does not know) is there too
    unreadable: bool = False
    #: a digest step's world instead (``kirim.explore.flow_digests``): its window,
    #: keyed or not, a delay before it, its own actions; None: not
    digest: Mapping[str, Any] | None = None

    @classmethod
    def draw(cls, seed: int) -> FlowWorld:
        rng = random.Random(seed)
        n = rng.randint(1, 3)
        until = rng.choice(UNTIL) if rng.random() < 0.5 else None
        return cls(
            seed=seed,
            first=rng.choice(["inbox", "email"]),
            delay=rng.choice([0.0, 30.0, 3600.0]),
            condition=rng.choice(CONDITIONS),
            on_doubt=rng.choice(["else", "then", "wait"]),
            with_else=rng.random() < 0.5,
            cancel_on=rng.random() < 0.7,
            on_unknown=rng.choice(list(OnUnknown)),
            script=tuple(rng.choice(["ok", "ok", "lost", "permanent"]) for _ in range(6)),
            recipients=n,
            race_cancel=rng.random() < 0.3,
            actions=tuple(
                (rng.choice(ACTIONS), rng.randrange(n)) for _ in range(rng.randint(3, 14))
            ),
            cancel_via=rng.choice(CANCEL_VIA),
            until=until,
            until_zone=rng.choice(ZONES),
            zones=tuple(rng.choice(ZONES) for _ in range(n)),
            start=rng.choice(STARTS) if until else START,
            unreadable=rng.random() < 0.3,
            digest=flow_digests.draw(rng) if rng.random() < 0.35 else None,
        )

    def to_json(self) -> dict[str, Any]:
        """The world's drawn values (a saved seed; ``from_json`` reads it back)."""
        return {
            "seed": self.seed,
            "first": self.first,
            "delay": self.delay,
            "condition": self.condition,
            "on_doubt": self.on_doubt,
            "with_else": self.with_else,
            "cancel_on": self.cancel_on,
            "on_unknown": str(self.on_unknown),
            "script": list(self.script),
            "recipients": self.recipients,
            "race_cancel": self.race_cancel,
            "actions": [[kind, who] for kind, who in self.actions],
            "cancel_via": self.cancel_via,
            "until": self.until,
            "until_zone": self.until_zone,
            "zones": list(self.zones),
            "start": self.start,
            "unreadable": self.unreadable,
            **({} if self.digest is None else {"digest": dict(self.digest)}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FlowWorld:
        """The world ``to_json`` gave."""
        return cls(
            seed=int(data["seed"]),
            first=str(data["first"]),
            delay=float(data["delay"]),
            condition=str(data["condition"]),
            on_doubt=str(data["on_doubt"]),
            with_else=bool(data["with_else"]),
            cancel_on=bool(data["cancel_on"]),
            on_unknown=OnUnknown(data["on_unknown"]),
            script=tuple(str(x) for x in data["script"]),
            recipients=int(data["recipients"]),
            race_cancel=bool(data["race_cancel"]),
            actions=tuple((str(kind), int(who)) for kind, who in data["actions"]),
            cancel_via=str(data.get("cancel_via", "library")),
            until=data.get("until"),
            until_zone=data.get("until_zone"),
            zones=tuple(data.get("zones", ())),
            start=float(data.get("start", START)),
            unreadable=bool(data.get("unreadable", False)),
            digest=data.get("digest"),
        )

    def type(self) -> NotificationType:
        if self.digest is not None:
            return flow_digests.digest_type(self.digest)
        branch: dict[str, Any] = {"branch": self.condition, "on_doubt": self.on_doubt}
        if self.condition == "data":
            branch.update(field="vip", equals=True)
        else:
            branch["step"] = "first"
        if self.with_else:
            branch["else"] = "last"
        steps: list[dict[str, Any]] = [{"send": self.first, "name": "first"}]
        if self.until is not None:
            until: dict[str, Any] = {"until": self.until}
            if self.until_zone is not None:
                until["zone"] = self.until_zone
            steps.append({"delay": until})
        elif self.delay:
            steps.append({"delay": self.delay})
        steps += [branch, {"send": "sms"}, {"send": "email", "name": "last"}]
        spec: dict[str, Any] = {
            "templates": {ch: {"title": "t {{ order }}", "body": "b"} for ch in CHANNELS},
            "steps": steps,
        }
        if self.cancel_on:
            spec.update(cancel_on=["order_done"], cancel_key="order")
        return parse_type("flow", spec)


CHANNELS = ("inbox", "email", "sms")
CANCEL_VIA = ("library", "event", "event_killed", "http_killed", "topic_killed")
#: the plain type whose events cancel a world's runs (``cancel_on``)
DONE = parse_type("order_done", {"templates": {"inbox": {"title": "done {{ order }}"}}})

#: what a world draws, read from it (each must take more than one value over the seeds)
FLOW_KNOBS: dict[str, Callable[[FlowWorld], Any]] = {
    "NotificationType.steps.first": lambda w: w.first,
    "NotificationType.steps.delay": lambda w: w.delay,
    "NotificationType.steps.delay.until": lambda w: w.until,
    "NotificationType.steps.delay.zone": lambda w: w.until_zone if w.until else "-",
    "Preferences.timezone": lambda w: w.zones,
    "clock.dst_edge": lambda w: w.start,
    "NotificationType.steps.branch": lambda w: w.condition,
    "NotificationType.steps.on_doubt": lambda w: w.on_doubt,
    "NotificationType.steps.else": lambda w: w.with_else,
    "NotificationType.cancel_on": lambda w: w.cancel_on,
    "NotificationType.cancel_key": lambda w: w.cancel_on,
    "Channel.on_unknown": lambda w: w.on_unknown,
    "action.cancel_run": lambda w: any(a == "cancel_run" for a, _ in w.actions),
    "action.cancel_event": lambda w: any(a == "cancel_event" for a, _ in w.actions),
    "action.crash": lambda w: any(a == "crash" for a, _ in w.actions),
    "action.stall_and_resume": lambda w: any(a == "resume" for a, _ in w.actions),
    "action.move_zone": lambda w: any(a == "move" for a, _ in w.actions),
    "action.prune": lambda w: any(a == "prune" for a, _ in w.actions),
    "run.unreadable": lambda w: w.unreadable,
    "race.cancel_in_request": lambda w: w.race_cancel,
    "cancel_event.via": lambda w: w.cancel_via,
    "NotificationType.steps.digest": lambda w: None if w.digest is None else w.digest["window"],
    "NotificationType.steps.digest.key": lambda w: None if w.digest is None else w.digest["keyed"],
    "NotificationType.steps.digest.after_delay": lambda w: (
        None if w.digest is None else w.digest["delay_first"]
    ),
    "digest.cancel_races_the_seal": lambda w: (
        w.digest is not None
        and any(a == "hold" for a, _ in w.digest["actions"])
        and any(a == "cancel_run" for a, _ in w.digest["actions"])
    ),
    "digest.late_event": lambda w: (
        w.digest is not None and any(a == "wait" for a, _ in w.digest["actions"])
    ),
    "digest.same_instant": lambda w: (
        w.digest is not None and any(a == "same_instant" for a, _ in w.digest["actions"])
    ),
}


@dataclass(slots=True)
class Outcome:
    seed: int
    violations: list[str] = field(default_factory=list)
    reported: list[str] = field(default_factory=list)
    runs: int = 0
    #: what the world reached: ``run:<status>``, ``step:<outcome>``,
    #: ``branch:<condition>:<outcome>``, ``cancel:left`` /
    #: ``cancel:held`` (a cancellation that named a delivery it could not simply
    #: cancel), ``cancel:after_prune`` (a cancelling event for a run pruned before),
    #: ``waits_in_doubt`` (a saved seed says what it must still reach)
    reached: set[str] = field(default_factory=set)
    #: runs an operator's prune took
    pruned: int = 0


async def run_world(
    world: FlowWorld, directory: Path, *, database_url: str | None = None
) -> Outcome:
    """Play ``world`` on a fresh SQLite file in ``directory`` (or on the empty database
    ``database_url``); its ``Outcome``."""
    clock = Clock(world.start)
    email = Provider(clock, list(world.script))
    sms = Provider(clock, [])
    channels = {
        "inbox": Channel(name="inbox", provider=InboxProvider()),
        "email": Channel(name="email", provider=email, on_unknown=world.on_unknown),
        "sms": Channel(name="sms", provider=sms),
    }
    url = database_url or f"sqlite:///{directory / 'flows.db'}"
    config = Config(database=url, max_attempts=3)
    app = Kirim(config, channels=channels, clock=clock, types=[world.type(), DONE])
    await app.open(migrate=True)
    out = Outcome(seed=world.seed)
    if world.digest is not None:
        try:
            await flow_digests.play(app, clock, world, email, url, out)
        finally:
            await app.close()
        return out
    cancels: list[tuple[float, Canceled]] = []
    #: each recipient's zones over time: (from when, zone)
    zones: dict[str, list[tuple[float, str | None]]] = {}
    try:
        for i, zone in enumerate(world.zones):
            zones[f"u{i}"] = [(clock.now(), zone)]
            if zone is not None:
                await app.set_preferences(Preferences(recipient_id=f"u{i}", timezone=zone))
        runs = []
        for i in range(world.recipients):
            done = await app.notify_event("flow", [f"u{i}"], _event(i), event_id=f"e{i}")
            runs.append(done.runs[0].run_id)
        newer = await _unreadable_run(app, url) if world.unreadable else None
        # a retried event creates nothing
        again = await app.notify_event("flow", ["u0"], {"order": "o0", "vip": True}, event_id="e0")
        if again.runs[0].created:
            out.violations.append("a retried event started a second run")

        raced: set[int] = set()
        gone: dict[int, Run] = {}  # run id -> the run as it was when prune took it

        async def race(message: Message) -> None:
            rid = message.recipient_id or ""
            i = int(rid[1:]) if rid[1:].isdigit() else -1
            if world.race_cancel and 0 <= i < len(runs) and i not in raced:
                raced.add(i)
                if runs[i] not in gone:
                    cancels.append((clock.now(), await app.cancel_run(runs[i], why="raced")))

        email.on_request = race
        sms.on_request = race
        workers = [app.worker(settings=SETTINGS, worker_id=f"w{k}") for k in range(2)]
        stalled: list[RunClaim] = []
        for n, (kind, who) in enumerate(world.actions):
            if kind == "move":  # the recipient moves to another zone mid-run
                now = ZONES[(ZONES.index(zones[f"u{who}"][-1][1]) + 1) % len(ZONES)]
                zones[f"u{who}"].append((clock.now(), now))
                prefs = Preferences(recipient_id=f"u{who}", timezone=now)
                await app.set_preferences(prefs)
                continue
            if kind == "cancel_event":
                await _cancel_event(app, clock, world, n, who, runs, gone, cancels, out)
                continue
            if kind == "prune":
                await _prune(app, clock, runs, gone, out)
                continue
            await _act(app, clock, workers[n % 2], kind, who, runs, cancels, stalled, out)
        for n in range(12 if world.until is None else 36):  # time enough to settle
            clock.t += 4000
            for w in workers:
                await w.run_once()
            if n == 6 and FLOW_KNOBS["action.prune"](world):  # again, once more are over
                await _prune(app, clock, runs, gone, out)
        found = [gone[r] if r in gone else await app.must_get_run(r) for r in runs]
        out.runs = len(found)
        out.pruned = len(gone)
        providers = {"email": email, "sms": sms}
        for run in found:
            await _check(app, world, run, providers, cancels, out)
            _delay_end(run, providers, zones.get(run.recipient_id, [(world.start, None)]), out)
        if newer is not None:
            await _check_set_aside(app, url, newer, out)
    finally:
        await app.close()
    return out


async def _act(
    app: Kirim,
    clock: Clock,
    worker: Any,
    kind: str,
    who: int,
    runs: list[int],
    cancels: list[tuple[float, Canceled]],
    stalled: list[RunClaim],
    out: Outcome,
) -> None:
    if kind == "tick":
        await worker.run_once()
    elif kind == "wait":
        clock.t += 1800
    elif kind in ("read", "seen"):
        page = await app.feed(f"u{who}")
        for item in page.items:
            await app.feed_action(f"u{who}", item.id, kind)
    elif kind == "cancel_run":
        with contextlib.suppress(NotFound):  # pruned: there is nothing left to cancel
            cancels.append((clock.now(), await app.cancel_run(runs[who], why="operator")))
    elif kind == "crash":  # a worker claims due runs and dies; its leases expire
        await _claim(app, clock, "ghost", out)
        clock.t += LEASE + 1
    elif kind == "stall":  # a worker claims due runs and freezes past its lease
        stalled += await _claim(app, clock, "stalled", out)
        clock.t += LEASE + 1
    elif kind == "resume":  # ... and comes back: its claims may have been taken over
        for claim in stalled:
            await app.store.advance_run(claim.run.id, claim.token, now=clock.now())
        stalled.clear()


class Killed(BaseException):
    """The process died (nothing on the way catches it)."""


async def _cancel_event(
    app: Kirim,
    clock: Clock,
    world: FlowWorld,
    n: int,
    who: int,
    runs: list[int],
    gone: Mapping[int, Run],
    cancels: list[tuple[float, Canceled]],
    out: Outcome,
) -> None:
    """An ``order_done`` of order ``o{who}`` (``world.cancel_via``). Its run, waiting
    before, is canceled once the event's first commit is made (``cancel_atomic``): an
    event is never recorded without the cancellations it causes. (A run pruned is
    over: nothing to cancel, nothing to check.)"""
    data = {"order": f"o{who}"}
    if runs[who] in gone:
        out.reached.add("cancel:after_prune")
    if world.cancel_via == "library":
        cancels += [(clock.now(), c) for c in await app.cancel_by_event("order_done", data)]
        return
    run = None if runs[who] in gone else await app.get_run(runs[who])
    waited = run is not None and run.status is RunStatus.WAITING
    event_id = f"done-{n}"
    if world.cancel_via == "event":
        done = await app.notify_event("order_done", [f"u{who}"], data, event_id=event_id)
        cancels += [(clock.now(), c) for c in done.canceled]
        await _check_atomic(app, world, event_id, runs[who], waited, out)
        return
    if world.cancel_via == "topic_killed":  # an event to a topic u{who} watches
        await app.subscribe("orders", f"u{who}")
        recorded = await _killed_after_commits(
            app, app.notify_topic("order_done", "orders", data, event_id=event_id)
        )
        if not (world.cancel_on and waited and recorded is not None):
            return  # nothing it must have canceled (a run pruned before is not read)
        canceled = (await app.must_get_run(runs[who])).status is RunStatus.CANCELED
        if not canceled:
            out.violations.append(
                f"cancel_atomic: topic event {event_id} committed, run {runs[who]} waits"
            )
        return
    if world.cancel_via == "http_killed":
        await _http_killed(app, clock, event_id, who, cancels, world, runs[who], waited, out)
        return
    written = await _killed_after_commits(
        app, app.notify_event("order_done", [f"u{who}"], data, event_id=event_id)
    )
    cancels += [(clock.now(), c) for c in getattr(written, "canceled", ())]
    await _check_atomic(app, world, event_id, runs[who], waited, out)
    # the caller, told nothing, gives the event again: it makes nothing twice
    again = await app.notify_event("order_done", [f"u{who}"], data, event_id=event_id)
    if any(d.created for d in again.deliveries):
        out.violations.append(f"cancel_atomic: event {event_id} given again made a delivery")


async def _check_atomic(
    app: Kirim, world: FlowWorld, event_id: str, run_id: int, waited: bool, out: Outcome
) -> None:
    if not waited:
        return
    recorded = await app.records(limit=1000)
    made = any(r.delivery.event_id == event_id for r in recorded.records)
    canceled = (await app.must_get_run(run_id)).status is RunStatus.CANCELED
    if world.cancel_on and made and not canceled:
        out.violations.append(
            f"cancel_atomic: event {event_id} committed, run {run_id} it cancels still waits"
        )


async def _http_killed(
    app: Kirim,
    clock: Clock,
    event_id: str,
    who: int,
    cancels: list[tuple[float, Canceled]],
    world: FlowWorld,
    run_id: int,
    waited: bool,
    out: Outcome,
) -> None:
    """``POST /v1/events`` of the ``order_done``, by a server that dies right after it
    records the event (its second commit: the first takes the request's key); the
    client sends it again under the same key and is answered the kept response, which
    must be that of an event whose cancellations were made."""
    import httpx

    from kirim.http import create_app
    from kirim.tokens import create_token

    _, secret = await create_token(app.store, f"explore-{event_id}", now=clock.now())
    body: dict[str, Any] = {"type": "order_done", "event_id": event_id}
    body.update(recipients=[f"u{who}"], data={"order": f"o{who}"})
    headers = {"Authorization": f"Bearer {secret}", "Idempotency-Key": event_id}
    transport = httpx.ASGITransport(app=create_app(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://explore") as client:
        written = await _killed_after_commits(
            app, client.post("/v1/events", json=body, headers=headers), commits=2
        )
        cancels += [(clock.now(), c) for c in getattr(written, "canceled", ())]
        await _check_atomic(app, world, event_id, run_id, waited, out)
        again = await client.post("/v1/events", json=body, headers=headers)
    if again.status_code not in (200, 201):
        out.violations.append(f"cancel_atomic: {event_id} given again: {again.status_code}")
        return
    kept = again.json().get("canceled_runs", [])
    if waited and world.cancel_on and kept != [run_id]:
        out.violations.append(
            f"cancel_atomic: {event_id}'s kept answer names {kept}, not run {run_id}"
        )


async def _killed_after_commits(app: Kirim, call: Any, *, commits: int = 1) -> Any:
    """Await ``call`` in a process that dies right after the store's ``commits``-th
    committed write; what that write's operation returned (None: it died before)."""
    driver: Any = app.store.driver  # type: ignore[attr-defined]
    run = driver.run
    seen: list[Any] = []

    async def dying(op: Any, *, write: bool = True, snapshot: bool = True) -> Any:
        result = await run(op, write=write, snapshot=snapshot)
        if write:
            seen.append(result)
            if len(seen) == commits:
                raise Killed
        return result

    driver.run = dying
    try:
        await call
    except Killed:
        pass
    finally:
        driver.run = run
    return seen[-1] if len(seen) == commits else None


def _event(i: int) -> dict[str, Any]:
    return {"order": f"o{i}", "vip": i % 2 == 0}


async def _prune(
    app: Kirim, clock: Clock, runs: list[int], gone: dict[int, Run], out: Outcome
) -> None:
    """An operator's prune, mid-scenario: every run it took must have been over, with
    none of its deliveries kept; each one's event is given again, and must start
    nothing."""
    before = {r: await app.get_run(r) for r in runs if r not in gone}
    await app.store.prune(now=clock.now(), keep=PRUNE_KEEP, keys=PRUNE_KEYS)
    for rid, run in before.items():
        if run is None or await app.get_run(rid) is not None:
            continue
        gone[rid] = run
        # judged here, not by the store's own rule (retention_records.over)
        if run.status is RunStatus.WAITING or run.next_at is not None:
            out.violations.append(
                f"prune_over: run {rid} pruned while {run.status} (next at {run.next_at})"
            )
        for s in run.recorded:
            if s.delivery_id and await app.get(s.delivery_id) is not None:
                out.violations.append(
                    f"prune_over: run {rid} pruned while its delivery {s.delivery_id} is kept"
                )
        i = runs.index(rid)
        again = await app.notify_event("flow", [f"u{i}"], _event(i), event_id=f"e{i}")
        if again.runs[0].created:
            out.violations.append(f"prune_replay: run {rid}'s event, given again, started one")


async def _claim(app: Kirim, clock: Clock, worker: str, out: Outcome) -> list[RunClaim]:
    """A worker's claim of due runs (one that then dies or stalls)."""
    try:
        return await app.store.claim_runs(worker_id=worker, now=clock.now(), lease=LEASE, limit=5)
    except UnreadableStep as exc:
        out.violations.append(f"set_aside: a claim failed on a run it cannot read ({exc})")
        return []


#: what a newer kirim may store as a run's step, which this one cannot read
NEWER_STEPS = '[{"kind": "webhook_wait", "name": "d", "url": "http://127.0.0.1:9/"}]'


def _sql(url: str, query: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """One statement on the world's database, outside kirim (``?`` placeholders)."""
    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(url.split("///", 1)[1])) as lite, lite:
            return list(lite.execute(query, args).fetchall())
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query.replace("?", "%s"), args)
        return list(cur.fetchall()) if cur.description else []


async def _unreadable_run(app: Kirim, url: str) -> int:
    """A run as a newer kirim would record it: a step of a kind this one lacks."""
    done = await app.notify_event("flow", ["u9"], _event(9), event_id="newer")
    run_id = done.runs[0].run_id
    _sql(url, "UPDATE kirim_runs SET steps = ? WHERE id = ?", (NEWER_STEPS, run_id))
    return run_id


async def _check_set_aside(app: Kirim, url: str, run_id: int, out: Outcome) -> None:
    """``set_aside``: a run this kirim cannot read is never advanced, never left
    claimed, and says why (the others' liveness is judged as ever); an operator's reads
    (``kirim run show|list``) show it, with why, instead of raising."""
    try:
        read = await app.must_get_run(run_id)
        listed = {r.id for r in await app.store.list_runs(limit=100_000)}
    except UnreadableStep as exc:
        out.violations.append(f"set_aside: an operator's read of run {run_id} raised: {exc}")
    else:
        if read.unreadable is None or run_id not in listed:
            out.violations.append(f"set_aside: unreadable run {run_id} read as readable")
    query = "SELECT status, cursor, claimed_by, why FROM kirim_runs WHERE id = ?"
    [(status, cursor, claimed_by, why)] = _sql(url, query, (run_id,))
    steps = _sql(url, "SELECT idx FROM kirim_run_steps WHERE run_id = ?", (run_id,))
    if status != "waiting" or int(cursor) != 0 or steps:
        out.violations.append(f"set_aside: unreadable run {run_id} was advanced ({status})")
    if claimed_by is not None:
        out.violations.append(f"set_aside: unreadable run {run_id} left claimed")
    if "newer kirim" not in (why or ""):
        out.violations.append(f"set_aside: unreadable run {run_id} does not say why: {why!r}")


async def _check(
    app: Kirim,
    world: FlowWorld,
    run: Run,
    providers: dict[str, Provider],
    cancels: list[tuple[float, Canceled]],
    out: Outcome,
) -> None:
    tag = f"run {run.id}"
    rec = {s.index: s for s in run.recorded}
    out.reached.add(f"run:{run.status}")
    out.reached.update(f"step:{s.outcome}" for s in run.recorded)
    out.reached.update(
        f"branch:{step.condition}:{s.outcome}"
        for s in run.recorded
        if isinstance(step := run.steps[s.index], Branch)
    )
    # one_path: walk the steps as the recorded decisions say
    on_path: set[int] = set()
    i = 0
    while i < len(run.steps):
        r = rec.get(i)
        if r is None:
            break
        on_path.add(i)
        step = run.steps[i]
        if isinstance(step, Send) and r.outcome is not StepOutcome.SENT:
            out.violations.append(f"one_path: {tag} step {i} (send) is {r.outcome}")
        if isinstance(step, Delay) and r.outcome is not StepOutcome.WAITED:
            out.violations.append(f"one_path: {tag} step {i} (delay) is {r.outcome}")
        if isinstance(step, Branch):
            if r.outcome not in (StepOutcome.THEN, StepOutcome.ELSE):
                out.violations.append(f"one_path: {tag} branch {i} is {r.outcome}")
            if r.outcome is StepOutcome.ELSE:
                target = next(
                    (j for j, s in enumerate(run.steps) if s.name == step.otherwise),
                    len(run.steps),
                )
                for j in range(i + 1, target):
                    on_path.add(j)
                    if rec.get(j) is None or rec[j].outcome is not StepOutcome.SKIPPED:
                        out.violations.append(f"one_path: {tag} step {j} not recorded skipped")
                i = target
                continue
            await _decided_right(app, run, step, r, rec, out)
        i += 1
    if run.status is RunStatus.DONE and i < len(run.steps):
        out.violations.append(f"one_path: {tag} done with step {i} not recorded")
    if run.status is RunStatus.WAITING and run.cursor != i:
        out.violations.append(f"one_path: {tag} waits at {run.cursor}, its path ends at {i}")
    for j in set(rec) - on_path:
        out.violations.append(f"one_path: {tag} step {j} recorded off its path (both ways?)")
    # step_once
    for j, step in enumerate(run.steps):
        if not isinstance(step, Send) or step.channel not in providers:
            continue
        got = providers[step.channel].received.get(step_key(run.key, j, step.channel), 0)
        if got > 1 and not (step.channel == "email" and world.on_unknown is OnUnknown.RETRY):
            out.violations.append(f"step_once: {tag} step {j} reached the user {got} times")
    # after_cancel
    for at, c in cancels:
        if c.run.id != run.id or not c.changed:
            continue
        out.reached.update(
            k for k, named in (("cancel:left", c.left), ("cancel:held", c.held)) if named
        )
        named = set(c.left) | set(c.held)
        for j, r in rec.items():
            if r.at > at:
                out.violations.append(f"after_cancel: {tag} step {j} recorded after the cancel")
            step = run.steps[j]
            if r.delivery_id is None or not isinstance(step, Send) or step.channel == "inbox":
                continue
            times = providers[step.channel].at.get(step_key(run.key, j, step.channel), [])
            late = [t for t in times if t > at]
            if late and r.delivery_id not in named:
                out.violations.append(
                    f"after_cancel: {tag} step {j} sent after a cancellation that did not name it"
                )
    # liveness
    if run.status is RunStatus.WAITING:
        step = run.steps[run.cursor]
        if isinstance(step, Branch) and step.on_doubt == "wait":
            state = await _state(app, run, step, rec)
            if state is not None and in_doubt(state):
                out.reported.append(f"{tag} waits on a step in doubt (on_doubt = wait)")
                out.reached.add("waits_in_doubt")
                return
        out.violations.append(f"liveness: {tag} still waits at step {run.cursor}")


def _delay_end(
    run: Run,
    providers: dict[str, Provider],
    zones: list[tuple[float, str | None]],
    out: Outcome,
) -> None:
    """A delay's recorded end is what its rule says, and nothing after it came before."""
    tag = f"run {run.id}"
    rec = {s.index: s for s in run.recorded}
    for i, step in enumerate(run.steps):
        r = rec.get(i)
        if not isinstance(step, Delay) or r is None:
            continue
        if r.until is None:
            out.violations.append(f"delay_end: {tag} step {i} recorded no end")
            continue
        if step.until is None:
            wanted = {r.at + step.seconds}
        else:  # the zone as it was when the step started (either, if it moved then)
            held = [z for t, z in zones if t < r.at][-1:] + [z for t, z in zones if t == r.at]
            wanted = {
                _first_from(r.at, step.until, zone or step.zone or "UTC")
                for zone in (held or [zones[0][1]])
            }
        if r.until not in wanted:
            out.violations.append(
                f"delay_end: {tag} step {i} ({r.why}) ends at {r.until}, not at {sorted(wanted)}"
            )
        for j in range(i + 1, len(run.steps)):
            later = rec.get(j)
            if later is not None and later.at < r.until:
                out.violations.append(f"delay_end: {tag} step {j} taken before the delay's end")
            s = run.steps[j]
            if isinstance(s, Send) and s.channel in providers:
                times = providers[s.channel].at.get(step_key(run.key, j, s.channel), [])
                if any(t < r.until for t in times):
                    out.violations.append(f"delay_end: {tag} step {j} sent before the delay's end")
        if run.status is RunStatus.DONE and i + 1 < len(run.steps) and (i + 1) not in rec:
            out.violations.append(
                f"liveness: {tag} done, but step {i + 1} after the delay not taken"
            )


def _first_from(at: float, clock: str, zone: str) -> float:
    """The explorer's own reading: the first whole minute from ``at`` at which the
    zone's clock reads ``clock`` or later on some day (``explore.localtime``)."""
    hours, minutes = (int(p) for p in clock.split(":"))
    wall = localtime._wall(at, localtime._zone(zone)).date()
    for offset in range(-1, 3):
        t = localtime._first_reading(wall + timedelta(days=offset), time(hours, minutes), zone)
        if t >= at:
            return t
    return math.inf


async def _state(app: Kirim, run: Run, step: Branch, rec: dict[int, Any]) -> StepState | None:
    index = next(j for j, s in enumerate(run.steps) if s.name == step.step)
    r = rec.get(index)
    if r is None or r.delivery_id is None:
        return None
    record = await app.get(r.delivery_id)
    if record is None:
        return None
    return StepState(status=record.delivery.status, doubt=record.delivery.doubt)


async def _decided_right(
    app: Kirim, run: Run, step: Branch, r: Any, rec: dict[int, Any], out: Outcome
) -> None:
    """A branch on the feed's marks says what the feed said when it decided."""
    if step.condition not in ("read", "unread", "seen", "unseen"):
        return
    index = next(j for j, s in enumerate(run.steps) if s.name == step.step)
    first = rec.get(index)
    target = run.steps[index]
    if first is None or first.delivery_id is None or getattr(target, "channel", "") != "inbox":
        return  # the feed's marks are the inbox's (another channel: never read, never seen)
    page = await app.feed(run.recipient_id)
    key = step_key(run.key, index, "inbox")
    item = next((x for x in page.items if x.idempotency_key == key), None)
    record = await app.get(first.delivery_id)
    if record is None or record.delivery.status in (DeliveryStatus.PENDING,):
        return
    if item is not None and r.at in (item.read_at, item.seen_at):
        return  # marked in the instant the branch was decided: either order is true
    read = item is not None and item.read_at is not None and item.read_at < r.at
    seen = item is not None and ((item.seen_at is not None and item.seen_at < r.at) or read)
    truth = {"read": read, "unread": not read, "seen": seen, "unseen": not seen}
    if record.delivery.status is not DeliveryStatus.SENT and item is None:
        return
    if truth[step.condition] != (r.outcome is StepOutcome.THEN):
        out.violations.append(
            f"decided_right: run {run.id} branch {step.condition} took {r.outcome} ({r.why})"
        )


def run_seeds(seeds: Iterable[int], *, database: str | None = None) -> list[Outcome]:
    """Each seed's world played and checked (a fresh database each: a SQLite file, or
    with ``database``, a PostgreSQL server, a throw-away database there)."""
    return run_worlds((FlowWorld.draw(seed) for seed in seeds), database=database)


def run_worlds(worlds: Iterable[FlowWorld], *, database: str | None = None) -> list[Outcome]:
    """Each world played and checked, as ``run_seeds`` does."""
    results = []
    for world in worlds:
        with tempfile.TemporaryDirectory(prefix="kirim-flows-") as tmp:
            if database is None:
                results.append(asyncio.run(run_world(world, Path(tmp))))
                continue
            from kirim.explore.pglane import PostgresDatabase

            db = PostgresDatabase(database)
            try:
                results.append(asyncio.run(run_world(world, Path(tmp), database_url=db.url)))
            finally:
                db.dispose()
    return results


__all__ = ["FLOW_KNOBS", "FlowWorld", "Outcome", "run_seeds", "run_world", "run_worlds"]
