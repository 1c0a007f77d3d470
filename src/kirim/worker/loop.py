"""The worker: claim, decide, write ahead, send, commit (DESIGN.md, worker protocol).

One asyncio process runs up to ``concurrency`` deliveries at once. Claims, attempt
intents and outcomes of concurrent deliveries are grouped into shared transactions
(``Batcher``). A heartbeat renews the job lease and the delivery claim of all work
in flight; a reaper returns expired leases to the queue.

Every intent is bounded in time. Its row carries ``send_deadline`` (the claim's time
+ ``send_within``, in the store's time) and ``settles_at`` (+ the request timeout +
``settle_margin``).
Here, right before the request leaves (``_send``, after the last checkpoint), the
worker checks a local monotonic deadline that is earlier than the stored one (it is
measured from before the claim was asked for) and a lease the heartbeat found lost;
past either, nothing is sent and the attempt is recorded as not sent. No other
worker can take the delivery over before the lease ends, which is after the
deadline. The request itself is cut off at the request timeout. So once
``settles_at`` has passed (store time) an attempt can no longer cause a request to
land, and what assumes that — lookup "not found" then send (``_in_doubt``), an
operator's retry or cancel (``store.transitions``) — waits for it. Residual window: a
process frozen between that check and the socket write for longer than the margin.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kirim.channels import Channel
from kirim.clock import Clock, SystemClock
from kirim.errors import (
    AmbiguousFailure,
    PermanentFailure,
    StoreError,
    TransientFailure,
)
from kirim.keys import new_request_id
from kirim.model import AttemptStatus, DeliveryStatus, Doubt, JobStatus, OnUnknown
from kirim.observe import tracing
from kirim.observe.logging import get_logger
from kirim.providers.base import Message, Reconcilable, Sent
from kirim.store.base import (
    AttemptOutcome,
    Claim,
    ClaimKind,
    Finish,
    FinishResult,
    Intent,
    Lease,
    Queue,
    QueueStats,
    WaitsForJobs,
)
from kirim.store.retention import PruneResult, Prunes
from kirim.text import stored_text
from kirim.worker.batching import Batcher
from kirim.worker.checkpoint import Checkpoint
from kirim.worker.cutoff import Cutoffs
from kirim.worker.decisions import Decisions
from kirim.worker.settings import WorkerSettings, default_worker_id
from kirim.worker.stats import WorkerStats

if TYPE_CHECKING:
    from kirim.observe.metrics import Metrics

__all__ = ["Worker"]

#: the reaper prunes (``[retention] keep``) this often, at most this many batches a round
PRUNE_EVERY = 60.0
PRUNE_BATCHES = 4

RESULT = {
    AttemptStatus.SUCCEEDED: "success",
    AttemptStatus.FAILED_PERMANENT: "failed_permanent",
    AttemptStatus.FAILED_TRANSIENT: "failed_transient",
    AttemptStatus.UNKNOWN: "unknown",
}


def request_timeout(channel: Channel, settings: WorkerSettings) -> float:
    """How long one request of ``channel`` may take: its provider's ``timeout`` if it
    names one, else the worker's ``request_timeout``."""
    named = getattr(channel.provider, "timeout", None)
    if isinstance(named, int | float) and not isinstance(named, bool) and named > 0:
        return float(named)
    return settings.request_timeout


def _outcome(result: FinishResult) -> str:
    """What a commit did, for the delivery span."""
    if result.committed:
        return "committed"
    return "late_success" if result.late_success else "stale_write_rejected"


class Worker:
    def __init__(
        self,
        store: Queue,
        channels: Mapping[str, Channel],
        *,
        settings: WorkerSettings | None = None,
        worker_id: str | None = None,
        clock: Clock | None = None,
        checkpoints: Checkpoint | None = None,
        rng: random.Random | None = None,
        metrics: Metrics | None = None,
        tracer: tracing.Tracer | None = None,
    ) -> None:
        """``metrics``: None records none. ``tracer``: by default kirim's tracer from the
        global OpenTelemetry SDK provider when one is set, else none (nothing is called)."""
        self.store = store
        self.channels = dict(channels)
        self.settings = settings or WorkerSettings()
        self.worker_id = worker_id or default_worker_id()
        self.clock = clock or SystemClock()
        self.checkpoints = checkpoints
        self.rng = rng or random.Random()
        self.stats = WorkerStats()
        self.log = get_logger(worker_id=self.worker_id)
        self.metrics = metrics
        self._tracer = tracer if tracer is not None else tracing.default_tracer()
        self.decide = Decisions(settings=self.settings, clock=self.clock, rng=self.rng)
        self._stats_at = float("-inf")  # time.monotonic() of the last gauge refresh
        self._leases: dict[int, Lease] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        #: jobs whose outcome is being committed (a lease gone now is not a takeover)
        self._finishing: set[int] = set()
        #: jobs whose lease the heartbeat found taken over: they must send nothing more
        self._lost: set[int] = set()
        #: this host's monotonic time just before each job's claim was asked for
        self._claimed_at: dict[int, float] = {}
        #: provider calls in flight, cut off at their request timeout
        self._cutoffs = Cutoffs()
        monotonic = getattr(self.clock, "monotonic", None)
        self._monotonic: Any = monotonic if callable(monotonic) else time.monotonic
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        #: set while the worker waits for work (tests use it to know it is idle)
        self.waiting = asyncio.Event()
        self._renewal_ok = True
        self._intents: Batcher[Intent, bool] = Batcher(store.record_intents)
        self._finishes: Batcher[Finish, FinishResult] = Batcher(store.finish)

    @property
    def busy(self) -> bool:
        """Whether a delivery is in flight in this worker."""
        return bool(self._tasks)

    def backoff(self, attempts: int) -> float:
        """Exponential backoff with full jitter (see ``Decisions.backoff``)."""
        return self.decide.backoff(attempts)

    # -- the loop ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; ``run`` finishes in-flight work within the grace period."""
        self._stopping.set()
        self._wake.set()

    async def run(self, *, burst: bool = False) -> WorkerStats:
        """Work until ``stop()`` (or, with ``burst``, until no work is left anywhere)."""
        self.log.info(
            "worker_started",
            concurrency=self.settings.concurrency,
            lease=self.settings.lease,
            burst=burst,
        )
        background = [asyncio.create_task(self._heartbeat_loop())]
        if not burst:
            background.append(asyncio.create_task(self._reap_loop()))
        store = self.store
        if isinstance(store, WaitsForJobs) and not burst:
            await store.wait_for_jobs(0)  # LISTEN before the first claim, so no wake-up is missed
        try:
            while not self._stopping.is_set():
                if burst:
                    await self.reap()
                claimed = await self.claim_and_start()
                if claimed:
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
        if not isinstance(store, WaitsForJobs) or self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            return
        # PostgreSQL: LISTEN/NOTIFY wakes an idle worker as soon as work is enqueued;
        # the poll interval stays the upper bound.
        waiters = {
            asyncio.create_task(store.wait_for_jobs(timeout)),
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
        except StoreError as exc:  # the store is away: not done, try again later
            self.log.error("store_unavailable", error=str(exc))
            await self.clock.sleep(self.settings.poll_interval)
            return False
        if due_in is not None and due_in <= 0:
            return False
        if unfinished:
            # A retry due soon, or someone else's lease (perhaps a dead worker's).
            wait = self.settings.poll_interval
            if due_in is not None:
                wait = min(wait, max(0.0, due_in))
            await self.clock.sleep(min(wait, self.settings.reap_every))
            return False
        return True

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
            )
        except StoreError as exc:
            self.log.error("claim_failed", error=str(exc))
            await self.clock.sleep(self.settings.poll_interval)
            return 0
        for claim in claims:
            self._claimed_at[claim.job.id] = asked
            self._start(claim)
        return len(claims)

    def _start(self, claim: Claim) -> None:
        job_id = claim.job.id
        if claim.kind is ClaimKind.CLAIMED:
            self._leases[job_id] = Lease(
                job_id=job_id, delivery_id=claim.delivery.id, token=claim.token
            )
        task = asyncio.create_task(self._process(claim))
        self._tasks[job_id] = task
        task.add_done_callback(lambda _t: self._done(job_id))

    def _done(self, job_id: int) -> None:
        self._tasks.pop(job_id, None)
        self._leases.pop(job_id, None)
        self._finishing.discard(job_id)
        self._lost.discard(job_id)
        self._claimed_at.pop(job_id, None)
        self._wake.set()

    # -- one delivery -----------------------------------------------------------------

    async def _process(self, claim: Claim) -> None:
        if self._tracer is None:
            await self._deliver(claim)
            return
        d, job = claim.delivery, claim.job
        attributes = {
            "notification_id": d.id,
            "event_id": d.event_id,
            "job_id": job.id,
            "attempt": job.attempts,
            "worker_id": self.worker_id,
            "idempotency_key": d.idempotency_key,
            "channel": d.channel,
            "claim": str(claim.kind),
        }
        with tracing.delivery_span(self._tracer, attributes):
            await self._deliver(claim)

    async def _deliver(self, claim: Claim) -> None:
        d, job = claim.delivery, claim.job
        log = self.log.bind(
            notification_id=d.id,
            event_id=d.event_id,
            job_id=job.id,
            attempt=job.attempts,
            idempotency_key=d.idempotency_key,
            channel=d.channel,
        )
        self.stats.claimed += 1
        if claim.kind is ClaimKind.NOOP:
            self.stats.noops += 1
            name = "noop_already_sent" if d.status is DeliveryStatus.SENT else "noop"
            log.info(name, status=str(d.status), reason=claim.reason)
            if self._tracer is not None:
                tracing.annotate(outcome="noop", reason=claim.reason)
            return
        if claim.kind is ClaimKind.BUSY:
            log.info("claim_lost", reason=claim.reason)
            if self._tracer is not None:
                tracing.annotate(outcome="busy", reason=claim.reason)
            return
        log.info("job_claimed", token=claim.token[:8], retry=job.attempts > 1)
        try:
            await self._checkpoint("after_claim", claim)
            channel = self.channels.get(d.channel)
            if channel is None:
                await self._commit(
                    log,
                    claim,
                    self.decide.retry(
                        claim, None, f"channel {d.channel!r} is not configured on {self.worker_id}"
                    ),
                )
                return
            if claim.doubtful:
                early = await self._in_doubt(log, claim, channel)
                if early is not None:
                    await self._commit(log, claim, early)
                    return
            await self._send(log, claim, channel)
        except Exception as exc:  # a bug or a store failure: leave the lease to expire
            self.stats.errors += 1
            log.exception("delivery_error", error=str(exc))
            if self._tracer is not None:
                tracing.annotate(outcome="error", error=str(exc))

    async def _in_doubt(self, log: Any, claim: Claim, channel: Channel) -> Finish | None:
        """DESIGN step 4: an earlier request may have reached the provider."""
        earlier = [a.provider_request_id for a in claim.doubtful]
        self.stats.in_doubt_seen += 1
        if channel.lookup and isinstance(channel.provider, Reconcilable):
            try:
                found = await channel.provider.lookup(claim.delivery.idempotency_key)
            except Exception as exc:
                log.warning("in_doubt", decision="lookup_failed", error=str(exc))
                return self.decide.retry(claim, None, f"lookup failed: {exc}")
            if found is not None:
                log.info(
                    "in_doubt",
                    decision="reconciled_sent",
                    earlier_requests=earlier,
                    provider_message_id=found.provider_message_id,
                )
                return self.decide.final(
                    claim,
                    DeliveryStatus.SENT,
                    doubt=Doubt.RESOLVED,
                    message_id=found.provider_message_id,
                )
            if claim.unsettled_until is not None:
                # "Not found" proves nothing while an earlier request may still land.
                log.info(
                    "in_doubt",
                    decision="wait_until_settled",
                    earlier_requests=earlier,
                    until=round(claim.unsettled_until, 3),
                )
                return self.decide.wait_until_settled(claim, claim.unsettled_until)
            log.info("in_doubt", decision="lookup_not_found_send", earlier_requests=earlier)
            return None
        forgotten = channel.dedup_window is not None and any(
            a.requested_at < claim.now - channel.dedup_window for a in claim.doubtful
        )
        if channel.idempotent and not forgotten:
            log.info("in_doubt", decision="resend_same_key", earlier_requests=earlier)
            return None
        if channel.idempotent:  # past its dedup window the provider forgot the key
            log.warning("in_doubt", decision="key_forgotten", earlier_requests=earlier)
        if channel.on_unknown is OnUnknown.RETRY:
            log.warning("in_doubt", decision="resend_at_least_once", earlier_requests=earlier)
            return None
        if channel.on_unknown is OnUnknown.HOLD:
            log.warning("in_doubt", decision="hold", earlier_requests=earlier)
            return self.decide.hold(claim, "held: an earlier request may have been delivered")
        log.warning("in_doubt", decision="assume_sent", earlier_requests=earlier)
        return self.decide.final(claim, DeliveryStatus.SENT, doubt=Doubt.ASSUMED_SENT)

    async def _send(self, log: Any, claim: Claim, channel: Channel) -> None:
        d, job = claim.delivery, claim.job
        request_id = new_request_id()
        log = log.bind(provider_request_id=request_id)
        timeout = request_timeout(channel, self.settings)
        send_within = self.settings.send_within
        lag = float(getattr(channel.provider, "lookup_lag", 0.0) or 0.0)
        send_deadline = claim.now + send_within  # the claim's store time + the bound
        intent = Intent(
            delivery_id=d.id,
            job_id=job.id,
            token=claim.token,
            number=job.attempts,
            provider_request_id=request_id,
            worker_id=self.worker_id,
            requested_at=self.clock.now(),
            send_deadline=send_deadline,
            settles_at=send_deadline + timeout + lag + self.settings.settle_allowance,
        )
        # The same bound on this host's monotonic clock, from before the claim was asked
        # for: earlier than the stored deadline, whatever this host's wall clock says.
        deadline = self._claimed_at.get(job.id, self._monotonic()) + send_within
        if not await self._intents.submit(intent):
            self.stats.claims_lost += 1
            log.warning("claim_lost", reason="claim token no longer holds; nothing was sent")
            if self._tracer is not None:
                tracing.annotate(outcome="claim_lost")
            return
        metrics = self.metrics
        if metrics is not None and claim.prior_requests == 1:
            metrics.multi_request(d.channel)  # its second request: counted once per delivery
        await self._checkpoint("before_provider_request", claim, provider_request_id=request_id)
        late = self._too_late(job.id, deadline)
        if late is not None:  # the bound of the intent: nothing leaves after it
            self.stats.not_sent += 1
            log.warning("not_sent", reason=late)
            outcome = AttemptOutcome(
                provider_request_id=request_id,
                status=AttemptStatus.FAILED_TRANSIENT,
                provider_message_id=None,
                error=f"not sent: {late}",
                completed_at=self.clock.now(),
            )
            await self._commit(log, claim, self.decide.retry(claim, outcome, outcome.error))
            return
        message = Message(
            delivery_id=d.id,
            idempotency_key=d.idempotency_key,
            provider_request_id=request_id,
            event_id=d.event_id,
            recipient=d.recipient,
            channel=d.channel,
            payload=d.payload,
            attempt=job.attempts,
        )
        log.info("provider_request")
        self.stats.requests += 1
        started = self.clock.now()
        t0 = time.perf_counter() if metrics is not None else 0.0
        if self._tracer is None:
            status, sent, error = await self._call(channel, message, timeout)
        else:
            status, sent, error = await self._traced_call(claim, channel, message, timeout)
        answered = time.perf_counter() if metrics is not None else 0.0
        latency = self.clock.now() - started
        if metrics is not None:
            metrics.provider_response(d.channel, status, answered - t0)
        message_id = sent.provider_message_id if sent else None
        log.info(
            "provider_response",
            result=RESULT[status],
            provider_message_id=message_id,
            latency_s=round(latency, 6),
            error=None if error is None else str(error),
        )
        await self._checkpoint("after_provider_response", claim, provider_request_id=request_id)
        outcome = AttemptOutcome(
            provider_request_id=request_id,
            status=status,
            provider_message_id=stored_text(message_id),
            error=None if error is None else stored_text(str(error)),
            completed_at=self.clock.now(),
        )
        finish = self.decide.after_request(claim, channel, outcome, error)
        await self._commit(log, claim, finish, answered=answered)

    def _too_late(self, job_id: int, deadline: float) -> str | None:
        """Why a committed intent must not be sent any more, if it must not."""
        if job_id in self._lost:
            return "the lease was taken over before the request left"
        if self._monotonic() > deadline:
            return "the intent's send deadline passed before the request left"
        return None

    async def _call(
        self, channel: Channel, message: Message, limit: float
    ) -> tuple[AttemptStatus, Sent | None, Exception | None]:
        """The provider request, cut off after ``limit`` seconds, classified (step 7)."""
        task = self._cutoffs.start(limit)
        try:
            sent = await channel.provider.send(message)
            return AttemptStatus.SUCCEEDED, sent, None
        except asyncio.CancelledError:
            if not self._cutoffs.was_cut(task):
                raise  # a shutdown, not the request timeout
            return (
                AttemptStatus.UNKNOWN,
                None,
                AmbiguousFailure(f"no answer within the request timeout of {limit:g} s"),
            )
        except PermanentFailure as exc:
            return AttemptStatus.FAILED_PERMANENT, None, exc
        except TransientFailure as exc:
            return AttemptStatus.FAILED_TRANSIENT, None, exc
        except AmbiguousFailure as exc:
            return AttemptStatus.UNKNOWN, None, exc
        except Exception as exc:  # a provider bug: we cannot know whether it was sent
            return AttemptStatus.UNKNOWN, None, exc
        finally:
            self._cutoffs.done(task)

    async def _traced_call(
        self, claim: Claim, channel: Channel, message: Message, limit: float
    ) -> tuple[AttemptStatus, Sent | None, Exception | None]:
        """``_call`` inside a ``kirim.provider_request`` span (child of the delivery's)."""
        attributes = {
            "notification_id": message.delivery_id,
            "event_id": message.event_id,
            "job_id": claim.job.id,
            "attempt": message.attempt,
            "worker_id": self.worker_id,
            "idempotency_key": message.idempotency_key,
            "provider_request_id": message.provider_request_id,
            "channel": message.channel,
        }
        with tracing.request_span(self._tracer, attributes) as span:
            status, sent, error = await self._call(channel, message, limit)
            tracing.annotate(
                span,
                result=RESULT[status],
                provider_message_id=None if sent is None else sent.provider_message_id,
                error=None if error is None else str(error),
            )
            if error is not None:
                tracing.fail(span, f"{RESULT[status]}: {error}")
        tracing.annotate(provider_request_id=message.provider_request_id)
        return status, sent, error

    async def _commit(
        self, log: Any, claim: Claim, finish: Finish, *, answered: float | None = None
    ) -> None:
        """DESIGN step 6: one transaction, fenced by the token; retried on store errors.

        ``answered``: ``time.perf_counter()`` when the provider answered (for metrics).
        """
        await self._checkpoint("before_commit", claim)
        self._finishing.add(claim.job.id)
        for attempt in range(5):
            try:
                result = await self._finishes.submit(finish)
                break
            except StoreError as exc:
                log.warning("commit_retry", error=str(exc), try_=attempt + 1)
                await asyncio.sleep(0.05 * 2**attempt)
        else:
            log.error("commit_failed", reason="the lease will expire and the reaper takes over")
            if self._tracer is not None:
                tracing.annotate(outcome="commit_failed")
            return
        if self.metrics is not None:
            self._measure(self.metrics, claim, finish, result, answered)
        if self._tracer is not None:
            tracing.annotate(
                outcome=_outcome(result),
                status=None if result.delivery_status is None else str(result.delivery_status),
                job_status=None if result.job_status is None else str(result.job_status),
            )
        if result.committed:
            self.stats.count(result.delivery_status, result.job_status, finish)
            log.info(
                "db_update",
                status=str(result.delivery_status),
                job_status=str(result.job_status),
                doubt=None if finish.doubt is None else str(finish.doubt),
                error=finish.error,
            )
            if result.job_status is JobStatus.RETRY_SCHEDULED:
                delay = finish.delay
                log.info("retry_scheduled", delay_s=None if delay is None else round(delay, 3))
            elif result.job_status is JobStatus.DEAD:
                log.warning("dead_lettered", error=finish.error)
        elif result.late_success:
            self.stats.late_successes += 1
            log.warning("stale_write_rejected", late_success=True, status="sent")
        elif result.reopened:
            self.stats.stale_rejected += 1
            log.warning(
                "stale_write_rejected",
                late_failure=True,
                status=str(result.delivery_status),
                reason="a late refusal withdrew the assumption that it was sent",
            )
        else:
            self.stats.stale_rejected += 1
            log.warning("stale_write_rejected", reason="claim token no longer holds")

    @staticmethod
    def _measure(
        metrics: Metrics,
        claim: Claim,
        finish: Finish,
        result: FinishResult,
        answered: float | None,
    ) -> None:
        channel = claim.delivery.channel
        if answered is not None and (result.committed or result.late_success):
            metrics.committed(time.perf_counter() - answered)
        if not result.committed:
            metrics.stale_write(late_success=result.late_success)
        elif result.job_status is JobStatus.RETRY_SCHEDULED:
            unknown = finish.attempt is not None and finish.attempt.status is AttemptStatus.UNKNOWN
            metrics.retry(channel, "unknown" if unknown else "transient")
        elif result.job_status is JobStatus.DEAD:
            metrics.dead_letter(channel)

    async def _checkpoint(self, name: str, claim: Claim, **context: Any) -> None:
        if self.checkpoints is not None:
            await self.checkpoints.hit(
                name,
                worker_id=self.worker_id,
                delivery_id=claim.delivery.id,
                job_id=claim.job.id,
                **context,
            )

    # -- leases ----------------------------------------------------------------------

    async def heartbeat(self) -> list[int]:
        """Renew every lease in flight; return the job ids whose lease was lost."""
        leases = list(self._leases.values())
        if not leases:
            return []
        held = await self.store.heartbeat(leases, now=self.clock.now(), lease=self.settings.lease)
        lost = []
        for lease, ok in zip(leases, held, strict=True):
            job_id = lease.job_id
            if ok or self._leases.get(job_id) is not lease or job_id in self._finishing:
                continue  # renewed, or gone because its job completed: not a takeover
            self._leases.pop(job_id, None)
            self._lost.add(job_id)  # a request that has not left now never will
            lost.append(job_id)
            self.log.warning("claim_lost", job_id=job_id, reason="lease taken over")
        return lost

    async def _heartbeat_loop(self) -> None:
        last_ok = self.clock.now()
        while True:
            await asyncio.sleep(self.settings.heartbeat_every)
            try:
                # A store that does not answer within a heartbeat period (the pool
                # waiting for a server that is down) fails the renewal like an error.
                async with asyncio.timeout(self.settings.heartbeat_every):
                    if self._leases or self._renewal_ok:
                        await self.heartbeat()
                    else:  # nothing left to renew: does the store answer again?
                        await self.store.next_run_at()
                last_ok = self.clock.now()
                if not self._renewal_ok:
                    self.log.info("lease_renewal_restored")
                self._renewal_ok = True
            except (StoreError, TimeoutError) as exc:
                if self.clock.now() - last_ok > self.settings.lease / 2 and self._renewal_ok:
                    self._renewal_ok = False
                    self.log.error(
                        "lease_renewal_failing",
                        error=str(exc) or "no answer within the heartbeat interval",
                        reason="not claiming new work until the store answers",
                    )

    async def reap(self) -> int:
        try:
            reaped = await self.store.reap(now=self.clock.now())
        except StoreError as exc:
            self.log.error("reap_failed", error=str(exc))
            return 0
        for r in reaped:
            self.stats.leases_expired += 1
            self.log.warning(
                "lease_expired",
                job_id=r.job_id,
                notification_id=r.delivery_id,
                attempt=r.attempt,
                lease_owner=r.owner,
                dead=r.dead,
            )
        metrics = self.metrics
        if metrics is not None:
            for r in reaped:
                metrics.lease_expired()
                if r.dead:
                    metrics.dead_letter(r.channel)
                else:
                    metrics.retry(r.channel, "lease_expired")
            if time.monotonic() - self._stats_at >= metrics.stats_interval:
                await self.refresh_stats()
        return len(reaped)

    async def refresh_stats(self) -> QueueStats | None:
        """Set the gauges from ``Store.queue_stats`` (the reaper does, every few seconds)."""
        if self.metrics is None:
            return None
        self._stats_at = time.monotonic()
        try:
            stats = await self.store.queue_stats(now=self.clock.now())
        except Exception as exc:  # gauges are not worth stopping the reaper for
            self.log.warning("queue_stats_failed", error=str(exc))
            return None
        self.metrics.set_queue_stats(stats)
        return stats

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reap_every)
            await self.reap()
            await self.retain()

    #: when the reaper prunes next (time.monotonic()), with ``retention_keep`` set
    _prune_at = 0.0

    async def retain(self) -> PruneResult | None:
        """Prune the ledger (``[retention]``) once every ``PRUNE_EVERY`` seconds: a few
        bounded batches, each its own transaction; None when it was not time, or there
        is no ``retention_keep``."""
        keep = self.settings.retention_keep
        store = self.store
        if keep is None or time.monotonic() < self._prune_at or not isinstance(store, Prunes):
            return None
        self._prune_at = time.monotonic() + PRUNE_EVERY
        total = PruneResult()
        try:
            for _ in range(PRUNE_BATCHES):
                done = await store.prune(
                    now=self.clock.now(), keep=keep, keys=self.settings.retention_keys
                )
                total += done
                if not done.more or not done.removed_anything:
                    break
        except StoreError as exc:
            self.log.error("prune_failed", error=str(exc))
        if total.removed_anything:
            self.log.info("pruned", **total.as_dict())
        return total

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
        leases = list(self._leases.values())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if leases:
            try:
                await self.store.release(leases, now=self.clock.now())
            except StoreError as exc:
                self.log.error("release_failed", error=str(exc))
            self.log.warning("leases_released", count=len(leases))
