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
- ``liveness``: once every worker has run with time enough, every run is over,
  unless it waits, as chosen, on a step in doubt (``on_doubt = "wait"``: reported);
- ``prune_over``: an operator's prune (``kirim prune``, drawn mid-scenario with no
  retention to speak of) takes only runs that were over (done or canceled, nothing
  due), and only once none of their deliveries is kept;
- ``prune_replay``: the event of a pruned run given again starts nothing (its key's
  tombstone), and a pruned run is checked as it was when it went.

``FLOW_KNOBS`` names what a world draws; ``tests/explore/test_flows.py`` checks each
takes more than one value over its seeds, and the mutation checks (the branch record
skipped) are caught within 200 seeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.errors import AmbiguousFailure, NotFound, PermanentFailure
from kirim.model import DeliveryStatus, OnUnknown
from kirim.notify.steps import Branch, Delay, Send
from kirim.notify.types import NotificationType, parse_type
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
    "prune",
)
#: the operator's prune: every finished row goes at once; keys are kept long
PRUNE_KEEP, PRUNE_KEYS = 0.0, 365 * 86_400.0


class Clock:
    """The world's one time line (every worker's and the store's)."""

    def __init__(self) -> None:
        self.t = 1_800_000_000.0

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
        self.on_request: Callable[[Message], Any] | None = None

    async def send(self, message: Message) -> Sent:
        key = message.idempotency_key
        self.at.setdefault(key, []).append(self.clock.now())
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

    @classmethod
    def draw(cls, seed: int) -> FlowWorld:
        rng = random.Random(seed)
        n = rng.randint(1, 3)
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
        )

    def type(self) -> NotificationType:
        branch: dict[str, Any] = {"branch": self.condition, "on_doubt": self.on_doubt}
        if self.condition == "data":
            branch.update(field="vip", equals=True)
        else:
            branch["step"] = "first"
        if self.with_else:
            branch["else"] = "last"
        steps: list[dict[str, Any]] = [{"send": self.first, "name": "first"}]
        if self.delay:
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

#: what a world draws, read from it (each must take more than one value over the seeds)
FLOW_KNOBS: dict[str, Callable[[FlowWorld], Any]] = {
    "NotificationType.steps.first": lambda w: w.first,
    "NotificationType.steps.delay": lambda w: w.delay,
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
    "action.prune": lambda w: any(a == "prune" for a, _ in w.actions),
    "race.cancel_in_request": lambda w: w.race_cancel,
}


@dataclass(slots=True)
class Outcome:
    seed: int
    violations: list[str] = field(default_factory=list)
    reported: list[str] = field(default_factory=list)
    runs: int = 0
    #: runs an operator's prune took
    pruned: int = 0


async def run_world(world: FlowWorld, directory: Path) -> Outcome:
    """Play ``world`` on a fresh SQLite file in ``directory``; its ``Outcome``."""
    clock = Clock()
    email = Provider(clock, list(world.script))
    sms = Provider(clock, [])
    channels = {
        "inbox": Channel(name="inbox", provider=InboxProvider()),
        "email": Channel(name="email", provider=email, on_unknown=world.on_unknown),
        "sms": Channel(name="sms", provider=sms),
    }
    config = Config(database=f"sqlite:///{directory / 'flows.db'}", max_attempts=3)
    app = Kirim(config, channels=channels, clock=clock, types=[world.type()])
    await app.open(migrate=True)
    out = Outcome(seed=world.seed)
    cancels: list[tuple[float, Canceled]] = []
    try:
        runs = []
        for i in range(world.recipients):
            done = await app.notify_event("flow", [f"u{i}"], _event(i), event_id=f"e{i}")
            runs.append(done.runs[0].run_id)
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
            if kind == "prune":
                await _prune(app, clock, runs, gone, out)
                continue
            await _act(app, clock, workers[n % 2], kind, who, runs, cancels, stalled)
        for n in range(12):  # time enough for everything to settle
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
) -> None:
    if kind == "tick":
        await worker.run_once()
    elif kind == "wait":
        clock.t += 1800
    elif kind in ("read", "seen"):
        page = await app.feed(f"u{who}")
        for item in page.items:
            await app.feed_action(f"u{who}", item.id, kind)
    elif kind == "cancel_event":
        for c in await app.cancel_by_event("order_done", {"order": f"o{who}"}):
            cancels.append((clock.now(), c))
    elif kind == "cancel_run":
        with contextlib.suppress(NotFound):  # pruned: there is nothing left to cancel
            cancels.append((clock.now(), await app.cancel_run(runs[who], why="operator")))
    elif kind == "crash":  # a worker claims due runs and dies; its leases expire
        await app.store.claim_runs(worker_id="ghost", now=clock.now(), lease=LEASE, limit=5)
        clock.t += LEASE + 1
    elif kind == "stall":  # a worker claims due runs and freezes past its lease
        stalled += await app.store.claim_runs(
            worker_id="stalled", now=clock.now(), lease=LEASE, limit=5
        )
        clock.t += LEASE + 1
    elif kind == "resume":  # ... and comes back: its claims may have been taken over
        for claim in stalled:
            await app.store.advance_run(claim.run.id, claim.token, now=clock.now())
        stalled.clear()


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
                return
        out.violations.append(f"liveness: {tag} still waits at step {run.cursor}")


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


def run_seeds(seeds: Iterable[int]) -> list[Outcome]:
    """Each seed's world played and checked (a fresh database each)."""
    results = []
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix="kirim-flows-") as tmp:
            results.append(asyncio.run(run_world(FlowWorld.draw(seed), Path(tmp))))
    return results


__all__ = ["FLOW_KNOBS", "FlowWorld", "Outcome", "run_seeds", "run_world"]
