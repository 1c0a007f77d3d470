"""One schedule: configuration + fault plan + policy (or recorded choices) → outcome.

The driver host ``S`` enqueues the notifications (through the operator's app;
``workload="events"``: records events of notification types and flips a
recipient's preferences at seeded times, ``events.py``), starts the worker hosts,
fires the faults at their virtual times, heals at the heal time (crashed and
stopped hosts restart as new processes on the same database), and waits until
everything is final and nothing is in flight at the provider — within ``max_time``
virtual seconds after the heal and ``max_steps`` steps. Then it stops the workers
gracefully and checks the invariants.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import logging
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kirim.channels import Channel
from kirim.chaos import Tally
from kirim.config import Config
from kirim.engine import Kirim
from kirim.explore import events, operator
from kirim.explore.checks import at_least_once, check_full
from kirim.explore.faults import (
    UNTIMED,
    Fault,
    draw_event_faults,
    draw_plan,
    draw_short_pauses,
    draw_takeovers,
    heal_time,
)
from kirim.explore.finishes import check_finish_by_claim
from kirim.explore.full import Full
from kirim.explore.hosts import SkewedClock, SQLiteDatabase, WorkerHost, run_worker, workdir
from kirim.explore.inbox import check_feed, check_feed_preferences, feed_truth
from kirim.explore.invariants import Ledger, Violation, check, verdicts
from kirim.explore.loop import (
    BASE,
    WORKER_NAMES,
    DeterministicLoop,
    Host,
    StepLimit,
    host_context,
)
from kirim.explore.pglane import PostgresDatabase
from kirim.explore.policy import ReplayPolicy, is_grouped, make_policy
from kirim.explore.provider import GroundTruth, ProviderModel
from kirim.explore.streams import check_streams
from kirim.explore.takeover import Takeovers
from kirim.explore.topics import check_topics
from kirim.explore.topics import faults as topic_faults
from kirim.explore.trace import Trace, capture_logs
from kirim.explore.world import World
from kirim.model import OnUnknown
from kirim.providers.base import Reconcilable
from kirim.worker import WorkerSettings

#: what the driver does: plain ``notify`` calls, or events of notification types
WORKLOADS = ("notify", "events", "full")
#: the full workload: a job due later than this after everything else settled waits
#: for a reason (a send window, checked by ``checks.liveness``) and does not hold the
#: run open
WAITING = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """The configuration of one schedule (everything a replay needs, with the plan)."""

    seed: int
    workers: int = 3
    policy: str = "host"
    provider: str = "plain"  # idempotent | plain | lookup
    on_unknown: str = "assume_sent"
    deliveries: int = 3
    concurrency: int = 2
    lease: float = 10.0
    timeout: float = 25.0
    max_attempts: int = 3
    #: notifications are due at random times within this many seconds
    spread: float = 20.0
    max_time: float = 400.0
    max_steps: int = 400_000
    #: PostgreSQL server URL for the PostgreSQL lane (None: SQLite)
    database: str | None = None
    #: ``module:callable`` wrapping the provider model in the user's own provider
    provider_factory: str | None = None
    #: ``notify``: one ``notify`` per delivery; ``events``: twice ``deliveries`` events
    #: of notification types (a digest among them) and a preference flip (``events.py``)
    workload: str = "notify"

    @staticmethod
    def draw(seed: int, **fixed: Any) -> Settings:
        """The per-seed parts (channel policy, workload, concurrency), then ``fixed``."""
        rng = random.Random(f"settings:{seed}")
        drawn: dict[str, Any] = {
            "on_unknown": rng.choices(("assume_sent", "hold", "retry"), (5, 4, 1))[0],
            "deliveries": rng.randint(2, 4),
            "concurrency": rng.choice((1, 2, 2, 4)),
        }
        drawn.update({k: v for k, v in fixed.items() if v is not None})
        if drawn.get("workload", "notify") not in WORKLOADS:
            raise ValueError(f"workload {drawn['workload']!r}: expected one of {WORKLOADS}")
        return Settings(seed=seed, **drawn)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True, kw_only=True)
class Outcome:
    settings: Settings
    plan: list[Fault]
    choices: list[int]
    lines: list[str]
    digest: str
    violations: list[Violation]
    steps: int
    end: float
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    #: the notifications judged in ``kirim.chaos``'s words
    verdicts: Tally = field(default_factory=Tally)

    @property
    def failed(self) -> bool:
        return bool(self.violations)


class Sim:
    def __init__(
        self,
        settings: Settings,
        plan: list[Fault],
        loop: DeterministicLoop,
        directory: Path,
    ) -> None:
        self.s = settings
        self.plan = plan
        self.loop = loop
        self.trace = Trace(loop.time)
        self.truth = GroundTruth()
        self.heal = heal_time(plan)
        self.world = (
            World.draw(settings.seed, workers=settings.workers)
            if (settings.workload == "full")
            else None
        )
        #: the full workload's start, as an offset of every clock from BASE
        self.shift = 0.0 if self.world is None else self.world.base - BASE
        self.true_clock = SkewedClock(loop, offset=self.shift)
        self.db: Any = (
            SQLiteDatabase(directory, f"s{settings.seed}")
            if settings.database is None
            else PostgresDatabase(settings.database)
        )
        self.url = self.db.url
        self.provider = ProviderModel(
            truth=self.truth,
            trace=self.trace,
            host=Host("P"),
            seed=settings.seed,
            idempotent=settings.provider == "idempotent",
            lease=settings.lease,
            timeout=settings.timeout,
        )
        provider: Any = self.provider
        if settings.provider_factory is not None:
            provider = load_factory(settings.provider_factory)(self.provider)
        self.channels = {
            "push": Channel(
                name="push",
                provider=provider,
                on_unknown=OnUnknown(settings.on_unknown),
                lookup=settings.provider == "lookup" and isinstance(provider, Reconcilable),
            )
        }
        self.types = events.types() if settings.workload == "events" else []
        self.full: Full | None = None
        if self.world is not None:
            self.full = Full(
                self.world, truth=self.truth, trace=self.trace, seed=settings.seed, time=loop.time
            )
            self.channels = dict(self.full.operator_channels)  # the operator's (``ops``)
            self.types = list(self.full.types)
        attempts = settings.max_attempts if self.world is None else self.world.max_attempts
        self.config = Config(database=self.url, max_attempts=attempts)
        self.settings = WorkerSettings(
            lease=settings.lease,
            concurrency=settings.concurrency,
            batch_size=settings.concurrency,
            poll_interval=1.0,
            backoff_base=1.0,
            backoff_max=8.0,
            shutdown_grace=1.5,
        )
        self.driver_error: str | None = None
        self.takeovers = Takeovers(loop, plan, self.trace.add)
        self.operator = Host("O")
        self.hosts: dict[str, WorkerHost] = {}
        self.operating = 0
        for name in WORKER_NAMES[: settings.workers]:
            skew = [f for f in plan if f.kind == "skew" and f.host == name]
            clock = (
                SkewedClock(loop, offset=self.shift + skew[0].offset, rate=skew[0].rate)
                if skew
                else (SkewedClock(loop, offset=self.shift))
            )
            self.hosts[name] = WorkerHost(name=name, host=Host(name), clock=clock)

    # -- hosts --------------------------------------------------------------------

    def start(self, wh: WorkerHost) -> None:
        wh.down = False
        channels, settings, types = self.channels, self.settings, self.types
        topics = None
        if self.full is not None and self.world is not None:
            index = WORKER_NAMES.index(wh.name)
            channels = self.full.channels_of(index)
            settings = self.world.workers[index].settings
            types = self.full.types_of(index)
            whole = self.world.workers[index].types and self.world.workers[index].channels is None
            topics = self.world.topics if whole else None  # one that can plan every batch
        wh.task = self.loop.create_task(
            run_worker(
                wh,
                inner=self.db.open_store(self.true_clock),
                channels=channels,
                settings=settings,
                config=self.config,
                plan=self.plan,
                heal=self.heal,
                seed=self.s.seed,
                on_intent=self._intent,
                note=self.trace.add,
                types=types,
                topics=topics,
                takeovers=self.takeovers,
            ),
            context=host_context(wh.host),
        )
        self.trace.add(f"process_start {wh.host.label}", host="S")

    def _intent(self, request_id: str) -> None:
        self.truth.intents.setdefault(request_id, self.loop.time())

    def fire(self, fault: Fault) -> None:
        self.trace.add(f"fault {fault.describe()}", host="S")
        wh = self.hosts.get(fault.host)
        if fault.kind == "crash" and wh is not None and not wh.down:
            self.loop.crash(wh.host)
            wh.down = True
        elif fault.kind == "stall" and wh is not None and not wh.down:
            self.loop.stall(wh.host, fault.at + fault.duration)
        elif fault.kind == "shutdown" and wh is not None and not wh.down:
            if wh.worker is not None:
                wh.worker.stop()
                wh.down = True
        elif fault.kind in ("cancel", "retry"):
            self.operating += 1
            self.loop.create_task(self._operate(fault), context=host_context(self.operator))

    def heal_all(self) -> None:
        self.trace.add("heal", host="S")
        for wh in self.hosts.values():
            if wh.down:
                if not wh.host.dead:
                    self.loop.crash(wh.host)  # a stopped process is gone for good
                wh.host = Host(wh.name, incarnation=wh.host.incarnation + 1)
                self.start(wh)

    async def _operate(self, fault: Fault) -> None:
        try:
            while True:
                await self._sweep(fault)
                if self.loop.time() + 3.0 > fault.at + fault.duration:
                    break
                await asyncio.sleep(3.0)
        finally:
            self.operating -= 1

    async def _sweep(self, fault: Fault) -> None:
        if fault.kind == "cancel":
            targets = [fault.delivery]
        else:
            targets = [d.delivery.id for d in await self.ops.store.dead_letters()]
        if self.full is not None:  # through the engine's verbs, as an operator does
            for did in targets:
                await self.full.act_on(self.ops, fault.kind, did)
            return
        for did in targets:
            answer = await operator.perform(
                self.ops.store, fault.kind, did, now=self.true_clock.now
            )
            self.trace.add(
                f"operator_{fault.kind} delivery={did} done={answer.done} {answer.reason}"
            )
            if answer.done and fault.kind == "cancel":
                self.truth.cancels.setdefault(did, self.loop.time())
            elif answer.done:
                self.truth.retries.setdefault(did, []).append(self.loop.time())

    # -- the run --------------------------------------------------------------------

    async def main(self) -> bool:
        """Drive the schedule; True when it reached quiescence within its bounds."""
        self.ops = Kirim(
            self.config,
            store=self.db.open_store(self.true_clock),
            channels=self.channels,
            clock=self.true_clock,
            types=self.types,
        )
        await self.ops.open()
        driver: asyncio.Task[None] | None = None
        if self.full is not None:
            await self.full.first_preferences(self.ops)
            for wh in self.hosts.values():
                self.start(wh)
            driver = self.loop.create_task(self.full.drive(self.ops))
        elif self.s.workload == "events":
            for wh in self.hosts.values():
                self.start(wh)
            count = 2 * self.s.deliveries  # an event makes one to three deliveries
            workload = events.draw(self.s.seed, events=count, spread=self.s.spread)
            driver = self.loop.create_task(
                events.drive(
                    self.ops, workload, truth=self.truth, time=self.loop.time, note=self.trace.add
                )
            )
        else:
            rng = random.Random(f"workload:{self.s.seed}")
            for i in range(1, self.s.deliveries + 1):
                at = self.true_clock.now() + rng.uniform(0.0, self.s.spread)
                await self.ops.notify(f"e{i}", f"u{i}", "push", {"n": i}, send_after=at)
            for wh in self.hosts.values():
                self.start(wh)
        for fault in self.plan:
            if fault.kind not in UNTIMED:
                self.loop.call_at(fault.at, self.fire, fault)
        self.loop.call_at(self.heal, self.heal_all)
        quiet = False
        while self.loop.time() < self.heal + self.max_time():
            await asyncio.sleep(1.0)
            settled = not self.operating and not self.truth.in_flight
            settled = settled and (driver is None or driver.done())
            if self.loop.time() >= self.heal and settled and self._nothing_to_run():
                quiet = True
                break
        for wh in self.hosts.values():
            if wh.worker is not None and not wh.host.dead:
                wh.worker.stop()
        tasks = [wh.task for wh in self.hosts.values() if wh.task and not wh.host.dead]
        if tasks:
            await asyncio.wait(tasks, timeout=60.0)
        if driver is not None and driver.done() and not driver.cancelled():
            failed = driver.exception()
            if failed is not None:  # the driver's store is fault-free: kirim refused
                self.driver_error = f"the driver failed: {failed!r}"
        self.end = self.true_clock.now()
        self.waiting = self.db.waiting(self.end) if self.full is not None else {}
        if self.full is not None:
            await self.full.settle_addresses(self.ops)
            await self.full.readers.settle()
        if self.full is not None:
            try:
                await self.full.probe(self.ops, self.db.pruned_with_tombstones())
            except Exception as exc:  # the probe's store is fault-free: kirim refused
                self.driver_error = f"the tombstone probe failed: {exc!r}"
        await self.ops.close()
        return quiet

    def patience(self) -> float:
        """The full workload: how far ahead a job may be due and still be waited for
        (backoffs, settle times, a rate's backlog); one due later waits for a send
        window (judged by ``checks.liveness``)."""
        assert self.world is not None
        w = self.world
        settle = max(
            p.settings.backoff_max
            + p.settings.request_timeout
            + 2 * p.settings.lease
            + (p.settings.settle_margin or p.settings.lease)
            for p in w.workers
        )
        sends = sum(max(1, len(s.recipients)) * 3 for s in w.sends)
        sends += 0 if w.topics is None else w.topics.deliveries(len(w.channels))
        slowest = min((c.rate for c in w.channels if c.rate is not None), default=None)
        backlog = 0.0 if slowest is None else sends / slowest
        return WAITING + settle + backlog

    def max_time(self) -> float:
        """Virtual seconds after the heal within which every delivery must be final:
        the one-channel workloads' fixed bound, or one computed from the drawn world
        (its backoffs, timeouts, leases and settle times per attempt, its channels'
        request rates for every delivery, its digest and throttle windows)."""
        if self.world is None:
            return self.s.max_time
        w = self.world
        per_attempt = max(
            p.settings.backoff_max
            + p.settings.request_timeout
            + 2 * p.settings.lease
            + (p.settings.settle_margin or p.settings.lease)
            for p in w.workers
        )
        sends = sum(max(1, len(s.recipients)) * 3 for s in w.sends)
        sends += 0 if w.topics is None else w.topics.deliveries(len(w.channels))
        slowest = min((c.rate for c in w.channels if c.rate is not None), default=None)
        rate = 0.0 if slowest is None else sends / slowest
        windows = 0.0
        for t in w.types:
            for rule in ("digest", "throttle"):
                if rule in t.table:
                    windows += float(str(t.table[rule]["window"]).rstrip("s")) * 2
        chain = max(len(c.fallback) + 1 for c in w.channels)
        return 120.0 + per_attempt * w.max_attempts * chain * 2 + rate + windows

    def _nothing_to_run(self) -> bool:
        """No job left to run, and no live worker still busy with a delivery (a stale
        task's late answer can still reopen one)."""
        busy = any(
            wh.worker is not None and not wh.host.dead and not wh.down and wh.worker.busy
            for wh in self.hosts.values()
        )
        if self.full is not None:  # jobs waiting far ahead for a send window do not count
            later = self.true_clock.now() + self.patience()
            kept = self.db.kept_callbacks() > 0  # the reaper has yet to apply them
            return not busy and not kept and int(self.db.active_jobs(before=later)) == 0
        return not busy and int(self.db.active_jobs()) == 0


def draw_faults(settings: Settings) -> list[Fault]:
    """The fault plan of a schedule's seed (the same on both lanes: SQLite and
    PostgreSQL play one plan)."""
    names = list(WORKER_NAMES[: settings.workers])
    plan = draw_plan(
        settings.seed, hosts=names, deliveries=settings.deliveries, lease=settings.lease
    )
    if settings.workload in ("events", "full"):
        plan += draw_event_faults(settings.seed, hosts=names)
    if settings.workload == "full":
        plan += draw_short_pauses(settings.seed, hosts=names, lease=settings.lease)
        world = World.draw(settings.seed, workers=settings.workers)
        plan += topic_faults(settings.seed, world.topics, hosts=names)
        plan += draw_takeovers(settings.seed, hosts=names, lease=settings.lease)
    return plan


def run_schedule(
    settings: Settings,
    *,
    plan: list[Fault] | None = None,
    choices: list[int] | None = None,
    directory: Path | None = None,
) -> Outcome:
    """Run one schedule (a replay when ``choices`` is given) and check it."""
    if plan is None:
        plan = draw_faults(settings)
    policy = (
        make_policy(settings.policy, settings.seed)
        if choices is None
        else ReplayPolicy(choices, grouped=is_grouped(settings.policy))
    )
    loop = DeterministicLoop(policy, max_steps=settings.max_steps)
    sim = Sim(settings, list(plan), loop, directory or workdir())
    quiet = False
    error: str | None = None
    lines: list[str] = []
    edges = UnknownEdges()
    with capture_logs(sim.trace), edges:
        try:
            main = loop.create_task(sim.main(), context=host_context(Host("S")))
            quiet = loop.run_until_complete(main)
            lines = list(sim.trace.lines)
        except StepLimit as exc:
            error = str(exc)
            lines = list(sim.trace.lines)
        finally:
            _cancel_rest(loop)
            loop.close()
    try:
        ledger: Ledger = sim.db.ledger()
    finally:
        sim.db.dispose()
    if sim.world is not None and sim.full is not None:
        world = sim.world
        feed_truth(sim.truth, ledger, world)  # the inbox's messages: what its users got
        attempts: dict[int, list[dict[str, Any]]] = {}
        for a in ledger.attempts:
            attempts.setdefault(a["delivery_id"], []).append(a)
        violations = check(
            ledger,
            sim.truth,
            at_least_once=lambda d: at_least_once(world, d, attempts.get(d["id"], [])),
            quiet=quiet,
            waiting=set(sim.waiting),
            in_commit=_inbox_channels(world),
        )
        violations += check_full(
            ledger,
            sim.truth,
            sim.full.full,
            world,
            end=sim.end,
            waiting=sim.waiting,
            patience=sim.patience(),
        )
        violations += check_feed(ledger, world)
        violations += check_feed_preferences(ledger, sim.full.full, world)
        violations += check_streams(sim.full.readers, ledger)
        if sim.full.topics is not None:
            violations += check_topics(
                ledger,
                sim.full.topics.truth,
                lambda t: world.notification_type(t).channels,
                flows={t.name for t in world.types if "steps" in t.table},
            )
    else:
        violations = check(
            ledger, sim.truth, at_least_once=settings.on_unknown == "retry", quiet=quiet
        )
    violations += check_finish_by_claim(ledger)
    for why in (error, sim.driver_error):
        if why is not None:
            violations.append(Violation(name="final", delivery=None, detail=why))
    violations += edges.violations()
    return Outcome(
        settings=settings,
        plan=list(plan),
        choices=list(loop.choices),
        lines=lines,
        digest=hashlib.sha256("\n".join(lines).encode()).hexdigest(),
        violations=violations,
        steps=loop.steps,
        end=loop.time(),
        deliveries=ledger.deliveries,
        verdicts=verdicts(ledger, sim.truth, set(sim.waiting), _inbox_channels(sim.world)),
    )


def _inbox_channels(world: World | None) -> set[str]:
    """The world's inbox channels: their effect is written in the finish's commit."""
    return set() if world is None else {c.name for c in world.channels if c.inbox}


class UnknownEdges(logging.Handler):
    """``known_edges``: every change of status the store wrote during the schedule is
    an edge of ``kirim.machine.EDGES`` (the store logs one that is not)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.found: list[tuple[int, str, str]] = []
        self._logger = logging.getLogger("kirim.machine")

    def __enter__(self) -> UnknownEdges:
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "unknown_edge":
            d = record.__dict__
            self.found.append((int(d["delivery_id"]), str(d["source"]), str(d["target"])))

    def violations(self) -> list[Violation]:
        return [
            Violation(
                name="known_edges",
                delivery=did,
                detail=f"{source} -> {target} is no edge of kirim.machine.EDGES",
            )
            for did, source, target in self.found
        ]


def load_factory(spec: str) -> Any:
    """``module:callable`` → the callable."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"provider factory {spec!r}: expected module:callable")
    return getattr(importlib.import_module(module), attr)


def _cancel_rest(loop: DeterministicLoop) -> None:
    """Cancel the tasks of live hosts still pending, and let them finish."""
    if loop.is_closed():
        return
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    crashed = set(map(id, loop._crashed))
    pending = [t for t in pending if id(t) not in crashed]
    if not pending:
        return
    for task in pending:
        task.cancel()
    loop.max_steps = loop.steps + 100_000  # the teardown gets a budget of its own
    with contextlib.suppress(StepLimit):
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


def replace_settings(settings: Settings, **changes: Any) -> Settings:
    return replace(settings, **changes)
