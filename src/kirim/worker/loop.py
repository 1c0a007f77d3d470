"""The worker: claims, concurrency, drain and shutdown (docs/design.md, "The worker protocol").

One asyncio process runs up to ``concurrency`` deliveries at once. The ``Worker``
claims due jobs (a batch, with a lease and a fresh fencing token, step 1) while it
has free slots, starts a task for each, and waits for work (LISTEN/NOTIFY on
PostgreSQL, else its poll interval) when there is none; on ``stop()`` (SIGTERM) it
claims nothing more, finishes in-flight work within the grace period and releases
what is left (step 9). It owns one of each role:

- ``Deliverer`` (``delivery``): one claimed delivery's protocol, steps 2 to 7;
- ``Heartbeat`` and ``Reaper`` (``leases``): lease renewal, and expired leases back
  to the queue with the gauges and the ledger's retention (step 8);
- ``Decisions`` (``decisions``): what each outcome means, pure.

The worker makes one ``WorkerContext`` (``context``: its store, channels, settings,
clocks, decisions, counters, observers and its work in flight, ``InFlight``) and
hands it to each role.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from kirim.channels import Channel
from kirim.clock import Clock, SystemClock
from kirim.errors import StoreError
from kirim.observe import tracing
from kirim.observe.logging import get_logger
from kirim.providers.base import Message, Sent
from kirim.store.base import Claim, QueueStats, Topics, WaitsForJobs, WorkerStore
from kirim.store.retention import PruneResult
from kirim.worker.burst import BurstProgress
from kirim.worker.checkpoint import Checkpoint
from kirim.worker.context import FeedListener, InFlight, WorkerContext
from kirim.worker.decisions import Decisions
from kirim.worker.delivery import Deliverer
from kirim.worker.flows import RunAdvancer
from kirim.worker.heap import frozen_heap
from kirim.worker.leases import Heartbeat, Reaper
from kirim.worker.settings import WorkerSettings, default_worker_id
from kirim.worker.stats import WorkerStats
from kirim.worker.topics import Plan, TopicExpander

if TYPE_CHECKING:
    from kirim.model import AttemptStatus
    from kirim.observe.metrics import Metrics
    from kirim.preferences import TypePolicy
    from kirim.runs import RenderGathered
    from kirim.store.base import Compose

__all__ = ["Worker"]


class Worker:
    """Claims due jobs and delivers them, up to ``concurrency`` at once (see the module's
    docstring for the roles it owns)."""

    def __init__(
        self,
        store: WorkerStore,
        channels: Mapping[str, Channel],
        *,
        settings: WorkerSettings | None = None,
        worker_id: str | None = None,
        clock: Clock | None = None,
        checkpoints: Checkpoint | None = None,
        rng: random.Random | None = None,
        metrics: Metrics | None = None,
        tracer: tracing.Tracer | None = None,
        policies: Mapping[str, TypePolicy] | None = None,
        digests: Mapping[str, Compose] | None = None,
        on_feed: FeedListener | None = None,
        topics: Plan | None = None,
        render_run: RenderGathered | None = None,
    ) -> None:
        """``metrics``: None records none. ``tracer``: by default kirim's tracer from the
        global OpenTelemetry SDK provider when one is set, else none (the worker's spans
        are then ``tracing.NO_SPANS``, which do nothing). ``policies``: the notification
        types (name -> ``TypePolicy``) whose deliveries the claim checks again against
        their recipients' preferences (a preference changed since the enqueue wins).
        ``digests``: the digest types (name -> compose function, ``kirim.store.base.
        Compose``), whose deliveries are sealed before they are sent. ``on_feed``: told
        of each inbox message a commit wrote (``Kirim.on_feed_change``). ``topics``: plans
        a batch of a topic event's subscribers (``kirim.worker.topics``; None: this
        worker expands no topic events). ``render_run``: a digest step's holder's later
        sends, rendered with its events (``kirim.runs.RenderGathered``)."""
        self._on_feed = on_feed
        self.store = store
        self.channels = dict(channels)
        self.policies = dict(policies or {})
        self.digests = dict(digests or {})
        self.settings = settings or WorkerSettings()
        self.worker_id = worker_id or default_worker_id()
        self.clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.stats = WorkerStats()
        self.log = get_logger(worker_id=self.worker_id)
        self.metrics = metrics
        #: the OpenTelemetry tracer; None: tracing is off
        self._tracer = tracer if tracer is not None else tracing.default_tracer()
        #: the channels whose effect is written in the finish's commit (the inbox)
        self.in_commit = frozenset(n for n, c in self.channels.items() if c.in_commit)
        self.decide = Decisions(
            settings=self.settings, clock=self.clock, rng=self.rng, in_commit=self.in_commit
        )
        self._tasks: dict[int, asyncio.Task[None]] = {}
        #: whether the last claim asked for work and found none (a burst worker reaps then)
        self._found_none = True
        monotonic = getattr(self.clock, "monotonic", None)
        self._monotonic: Any = monotonic if callable(monotonic) else time.monotonic
        self._burst = BurstProgress(self.log, self._monotonic)
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        #: set while the worker waits for work (tests use it to know it is idle)
        self.waiting = asyncio.Event()
        #: what the roles share; the work in flight is ``context.in_flight``'s
        self.context = WorkerContext(
            store=store,
            channels=self.channels,
            settings=self.settings,
            worker_id=self.worker_id,
            clock=self.clock,
            monotonic=self._monotonic,
            decide=self.decide,
            stats=self.stats,
            log=self.log,
            metrics=self.metrics,
            spans=tracing.spans_for(self._tracer),
            in_flight=InFlight(),
            on_feed=self._on_feed,
        )
        self._deliverer = Deliverer(
            self.context,
            checkpoints=checkpoints,
            digests=self.digests,
            types=frozenset(self.policies) | frozenset(self.digests),
        )
        self._heartbeat = Heartbeat(self.context)
        self._reaper = Reaper(self.context)
        self.topics = None if topics is None else TopicExpander(
            cast(Topics, store), topics, worker_id=self.worker_id, clock=self.clock,
            lease=self.settings.lease, poll_interval=self.settings.poll_interval, log=self.log,
        )  # fmt: skip
        self._runs = RunAdvancer(self.context, render=render_run)

    @property
    def checkpoints(self) -> Checkpoint | None:
        """Where a test (or the explorer) pauses this worker; None: nowhere."""
        return self._deliverer.checkpoints

    @checkpoints.setter
    def checkpoints(self, value: Checkpoint | None) -> None:
        self._deliverer.checkpoints = value

    @property
    def busy(self) -> bool:
        """Whether a delivery is in flight in this worker."""
        return bool(self._tasks)

    @property
    def _renewal_ok(self) -> bool:
        """Whether lease renewals succeed (else nothing new is claimed)."""
        return self._heartbeat.renewal_ok

    def backoff(self, attempts: int) -> float:
        """Exponential backoff with full jitter (see ``Decisions.backoff``)."""
        return self.decide.backoff(attempts)

    # -- the loop ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; ``run`` finishes in-flight work within the grace period."""
        self._stopping.set()
        self._wake.set()

    async def run(self, *, burst: bool = False) -> WorkerStats:
        """Work until ``stop()`` (or, with ``burst``, until no work is left anywhere),
        with the heap as it was before frozen out of the collector's passes (``heap``)."""
        with frozen_heap():
            return await self._run(burst=burst)

    async def _run(self, *, burst: bool) -> WorkerStats:
        self.log.info(
            "worker_started",
            concurrency=self.settings.concurrency,
            lease=self.settings.lease,
            burst=burst,
        )
        background = [asyncio.create_task(self._heartbeat.run())]
        if not burst:
            background.append(asyncio.create_task(self._reaper.run()))
        if self.topics is not None and not burst:  # a burst expands in its own loop
            background.append(asyncio.create_task(self.topics.run(self._stopping)))
        store = self.store
        if _listens(store) and not burst:
            await cast(WaitsForJobs, store).wait_for_jobs(
                0
            )  # LISTEN before the first claim, so no wake-up is missed
        reaped_at = -math.inf
        try:
            while not self._stopping.is_set():
                if burst:
                    # A burst worker is its own reaper: at the reaper's cadence while it
                    # finds work, and each round once its last claim found none (an
                    # expired lease waits no longer for it than for a long-running
                    # worker's reaper).
                    now = self._monotonic()
                    if self._found_none or now - reaped_at >= self.settings.reap_every:
                        reaped_at = now
                        await self.reap()
                    if self.topics is not None:
                        await self.topics.step_safely()
                await self._runs.tick()
                claimed = await self.claim_and_start()
                if claimed or self._runs.more:  # more due: no wait for the poll interval
                    continue
                if burst and not self._tasks and await self._nothing_left():
                    break
                await self._idle()
        finally:
            await self._shutdown()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
        self.log.info("worker_stopped", **self.stats.as_dict())
        return self.stats

    async def run_once(self) -> int:
        """Reap, claim one batch, and process it to the end. For tests and tools."""
        await self.reap()
        await self._runs.tick(force=True)
        claimed = await self.claim_and_start()
        await self.drain()
        return claimed

    async def drain(self) -> None:
        """Wait for every delivery in flight."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def _idle(self) -> None:
        self._wake.clear()
        self.waiting.set()
        try:
            await self._wait_for_work()
        finally:
            self.waiting.clear()

    async def _wait_for_work(self) -> None:
        timeout = self.settings.poll_interval
        # A due job is no reason to wake while renewals fail: nothing is claimed then
        # (waking at once would spin until the heartbeat finds the store again).
        due_in = None if self._tasks or not self._renewal_ok else await self._next_due_in()
        if due_in is not None:
            timeout = min(timeout, max(0.0, due_in))
        if self._tasks and len(self._tasks) < self.settings.concurrency:
            timeout = min(timeout, 0.05)
        store = self.store
        if not _listens(store) or self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            return
        # PostgreSQL: LISTEN/NOTIFY wakes an idle worker as soon as work is enqueued;
        # the poll interval stays the upper bound.
        waiters = {
            asyncio.create_task(cast(WaitsForJobs, store).wait_for_jobs(timeout)),
            asyncio.create_task(self._wake.wait()),
        }
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    async def _nothing_left(self) -> bool:
        """Burst mode ends when no job is due, running anywhere, or waiting for a retry.

        Jobs scheduled for later by ``send_after`` do not keep a burst worker alive;
        retries do, since they finish the work that was already started.
        """
        try:
            unfinished = await self.store.in_flight()
            due_in = await self.store.next_due_in(now=self.clock.now())
            expanding = self.topics is not None and not await self.topics.nothing_left()
        except StoreError as exc:  # the store is away: not done, try again later
            self.log.error("store_unavailable", error=str(exc))
            await self.clock.sleep(self.settings.poll_interval)
            return False
        if due_in is not None and due_in <= 0:
            return False
        if expanding:  # a topic's fan-out is under way
            await self.clock.sleep(self.settings.poll_interval)
            return False
        await self._say_waiting(done=not unfinished)
        if unfinished:
            # A retry due soon, or someone else's lease (perhaps a dead worker's).
            wait = self.settings.poll_interval
            if due_in is not None:
                wait = min(wait, max(0.0, due_in))
            await self.clock.sleep(min(wait, self.settings.reap_every))
            return False
        return True

    async def _say_waiting(self, *, done: bool) -> None:
        """Say what the burst waits for (or, ``done``, what it leaves); a store that does
        not answer is said elsewhere (the next step)."""
        try:
            now = self.clock.now()
            found = await self.store.waiting(now=now)
        except StoreError:
            return
        if done:
            self._burst.done(found, now)
        else:
            self._burst.waiting(found, now)

    async def _next_due_in(self) -> float | None:
        """Seconds until the next job is due, in the store's time (never this worker's
        clock against the store's: they may disagree); None (poll) while the store does
        not answer."""
        try:
            return await self.store.next_due_in(now=self.clock.now())
        except StoreError as exc:
            self.log.error("store_unavailable", error=str(exc))
            return None

    async def claim_and_start(self) -> int:
        """Claim as many due jobs as there are free slots and start each."""
        free = self.settings.concurrency - len(self._tasks)
        if free <= 0 or not self._renewal_ok:
            return 0
        asked = self._monotonic()
        try:
            claims = await self.store.claim(
                worker_id=self.worker_id,
                now=self.clock.now(),
                lease=self.settings.lease,
                limit=min(free, self.settings.batch_size),
                policies=self.policies or None,
            )
        except StoreError as exc:
            self.log.error("claim_failed", error=str(exc))
            await self.clock.sleep(self.settings.poll_interval)
            return 0
        self._found_none = not claims
        for claim in claims:
            if claim.suppressed is not None:
                self._suppressed(claim)
            self._start(claim, asked)
        return len(claims)

    def _suppressed(self, claim: Claim) -> None:
        """The claim-time check stopped a delivery: say so, and count it by reason."""
        d, reason = claim.delivery, str(claim.suppressed)
        self.stats.suppressed += 1
        if self.metrics is not None:
            self.metrics.suppressed(d.channel, reason)
        self.log.info(
            "delivery_suppressed",
            notification_id=d.id,
            event_id=d.event_id,
            job_id=claim.job.id,
            idempotency_key=d.idempotency_key,
            channel=d.channel,
            type=d.type,
            recipient_id=d.recipient_id,
            reason=reason,
            at="claim",
        )

    def _start(self, claim: Claim, asked: float) -> None:
        job_id = claim.job.id
        self.context.in_flight.start(claim, asked)
        task = asyncio.create_task(self._deliverer.process(claim))
        self._tasks[job_id] = task
        task.add_done_callback(lambda _t: self._done(job_id))

    def _done(self, job_id: int) -> None:
        self._tasks.pop(job_id, None)
        self.context.in_flight.done(job_id)
        self._wake.set()

    async def _shutdown(self) -> None:
        """Finish in-flight work within the grace period; release what is left."""
        if not self._tasks:
            return
        self.log.info(
            "worker_draining", in_flight=len(self._tasks), grace_s=self.settings.shutdown_grace
        )
        tasks = list(self._tasks.values())
        _, pending = await asyncio.wait(tasks, timeout=self.settings.shutdown_grace)
        if not pending:
            return
        leases = self.context.in_flight.leases()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if leases:
            try:
                await self.store.release(leases, now=self.clock.now())
            except StoreError as exc:
                self.log.error("release_failed", error=str(exc))
            self.log.warning("leases_released", count=len(leases))

    # -- the roles' rounds, for tests and tools -------------------------------------

    async def heartbeat(self) -> list[int]:
        """Renew every lease in flight; return the job ids whose lease was lost."""
        return await self._heartbeat.beat()

    async def reap(self) -> int:
        """Return the jobs whose lease expired to the queue (``Reaper.reap``)."""
        return await self._reaper.reap()

    async def apply_callbacks(self) -> int:
        """Apply the callbacks kept for messages recorded since (``Reaper``)."""
        return await self._reaper.apply_callbacks()

    async def refresh_stats(self) -> QueueStats | None:
        """Set the gauges from ``Store.queue_stats`` (the reaper does, every few seconds)."""
        return await self._reaper.refresh_stats()

    async def retain(self) -> PruneResult | None:
        """Prune the ledger (``[retention]``) when it is time (``Reaper.retain``)."""
        return await self._reaper.retain()

    async def _call(
        self, channel: Channel, message: Message, limit: float
    ) -> tuple[AttemptStatus, Sent | None, Exception | None]:
        """One provider request, cut off and classified (``Deliverer.call``)."""
        return await self._deliverer.call(channel, message, limit)


def _listens(store: WorkerStore) -> bool:
    """Whether the store declares LISTEN/NOTIFY wake-ups (a test's double need not say)."""
    return bool(getattr(store, "listens", False))
