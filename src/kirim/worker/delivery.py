"""One claimed delivery's protocol: decide, write ahead, send, classify, commit.

``Deliverer.process`` runs docs/design.md's steps 2 to 7 for one claim (the worker
runs many at once):

- ``_deliver``: a no-op or busy claim ends here; a channel that is not configured
  is retried; the attempt's channel is routed from the ledger (``route``: the
  delivery's own or one of its fallbacks); a digest is sealed (``prepare``: its
  payload composed of its events); an earlier request in doubt goes through
  the in-doubt policy of the channel that may have it first (``_in_doubt``: the
  provider is asked when it can be, ``Decisions.in_doubt`` decides);
- ``_send``: the channel's request rate is kept (``prepare``); the attempt's intent
  is committed, fenced by the claim token and bounded in time (``_intent``); right
  before the request would leave, the local deadline and a lease the heartbeat found
  lost are checked (``_too_late``), and past either nothing leaves (``_not_sent``);
- ``_request``: the provider call (``call``, cut off at its request timeout and
  classified, step 7), measured and logged, then decided (``Decisions``);
- ``_commit``: outcome, delivery status and job in one transaction, fenced by the
  token (step 6), counted, measured and logged.

Intents and outcomes of concurrent deliveries share transactions (``Batcher``).
Tracing, metrics and checkpoints are called at fixed points; tracing is a no-op
object when it is off (``kirim.observe.tracing.NO_SPANS``).

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
land, and what assumes that — lookup "not found" then send (``Decisions.in_doubt``),
an operator's retry or cancel (``store.transitions``) — waits for it. Residual
window: a process frozen between that check and the socket write for longer than
the margin. A pause longer than ``RECHECK_AFTER`` between the intent's commit and
the request (a stall, a long garbage collection) renews the lease first: a claim that
was revoked meanwhile (a provider's callback ended the delivery) sends nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kirim.channels import Channel
from kirim.errors import (
    AmbiguousFailure,
    DeadAddress,
    PermanentFailure,
    StoreError,
    TransientFailure,
)
from kirim.keys import new_request_id
from kirim.model import AttemptStatus, DeliveryStatus, JobStatus
from kirim.observe import RESULT
from kirim.providers.base import Message, Reconcilable, Sent
from kirim.store.base import (
    AttemptOutcome,
    Claim,
    ClaimKind,
    Compose,
    Finish,
    FinishResult,
    Intent,
    Lease,
)
from kirim.text import stored_message_id, stored_text
from kirim.worker.batching import Batcher
from kirim.worker.checkpoint import Checkpoint
from kirim.worker.context import WorkerContext
from kirim.worker.cutoff import Cutoffs
from kirim.worker.decisions import (
    InDoubt,
    Lookup,
    Route,
    asks_provider,
    request_timeout,
    route,
)
from kirim.worker.delivery_log import DeliveryLog
from kirim.worker.prepare import Prepare

if TYPE_CHECKING:
    from kirim.observe.metrics import Metrics

__all__ = ["RECHECK_AFTER", "Deliverer", "rate_slack", "request_timeout"]


def rate_slack(rate: float) -> float:
    """How late after its rate slot a request may still leave: a tenth of the
    interval, at most a quarter of a second."""
    return min(0.1 / rate, 0.25)


#: seconds between an intent's commit and its request after which the worker confirms
#: its claim before sending (a pause: a callback or the reaper may have revoked it)
RECHECK_AFTER = 0.5


class Deliverer:
    """Runs the protocol of each delivery a worker claimed (see the module docstring)."""

    def __init__(
        self,
        context: WorkerContext,
        *,
        checkpoints: Checkpoint | None = None,
        digests: Mapping[str, Compose] | None = None,
        types: frozenset[str] | None = None,
    ) -> None:
        """``context``: what the worker's roles share (its work in flight among them,
        changed through ``InFlight``'s verbs). ``checkpoints``: where a test pauses
        the worker; ``digests``: the compose function of each digest type
        (``prepare``); ``types``: the notification types this worker knows (None:
        those of ``digests``). A delivery of another type is not sent by this worker:
        it cannot tell whether it is a digest to seal, nor check its recipient's
        preferences."""
        self.context = context
        self.checkpoints = checkpoints
        #: provider calls in flight, cut off at their request timeout
        self._cutoffs = Cutoffs()
        self.types = frozenset(digests or {}) if types is None else types
        self.prepare = Prepare(context, digests=digests or {})
        self._intents: Batcher[Intent, bool] = Batcher(context.store.record_intents)
        self._finishes: Batcher[Finish, FinishResult] = Batcher(context.store.finish)

    def process(self, claim: Claim) -> Coroutine[Any, Any, None]:
        """The delivery of ``claim``, inside its span."""
        return self.context.spans.delivery(claim, self.context.worker_id, self._deliver)

    # -- steps 2 to 4 ------------------------------------------------------------------

    async def _deliver(self, claim: Claim) -> None:
        """End a no-op or busy claim; else the in-doubt policy, when an earlier request
        may have arrived, then the request. An error leaves the lease to expire."""
        d, job = claim.delivery, claim.job
        log = DeliveryLog(
            self.context.log,
            {
                "notification_id": d.id,
                "event_id": d.event_id,
                "job_id": job.id,
                "attempt": job.attempts,
                "idempotency_key": d.idempotency_key,
                "channel": d.channel,
            },
        )
        self.context.stats.claimed += 1
        if claim.kind is ClaimKind.NOOP:
            self.context.stats.noops += 1
            name = "noop_already_sent" if d.status is DeliveryStatus.SENT else "noop"
            log.info(name, status=str(d.status), reason=claim.reason)
            self.context.spans.outcome("noop", claim.reason)
            return
        if claim.kind is ClaimKind.BUSY:
            log.info("claim_lost", reason=claim.reason)
            self.context.spans.outcome("busy", claim.reason)
            return
        log.info("job_claimed", token=claim.token[:8], retry=job.attempts > 1)
        try:
            await self._checkpoint("after_claim", claim)
            home = self.context.channels.get(d.channel)
            way = None if home is None else route(home.chain, claim.history, claim.doubtful)
            channel = None if way is None else self.context.channels.get(way.to)
            if home is None or way is None or channel is None:
                missing = d.channel if way is None else way.to
                await self._refuse(log, claim, f"channel {missing!r}")
                return
            if d.type is not None and d.type not in self.types:
                await self._refuse(log, claim, f"notification type {d.type!r}")
                return
            if way.why == "exhausted":
                error = f"refused for good by every channel of {', '.join(home.chain)}"
                await self._commit(
                    log,
                    claim,
                    self.context.decide.final(
                        claim, DeliveryStatus.FAILED, job=JobStatus.DEAD, error=error
                    ),
                )
                return
            self._routed(log, d.channel, way)
            if self.prepare.carries_digest(claim):
                sealed = await self._seal(log, claim)
                if sealed is None:
                    return
                claim = sealed
            if claim.doubtful:
                choice = await self._in_doubt(log, claim, channel)
                if choice.not_found:  # none of them arrived: recorded, and out of doubt
                    await self.context.store.not_found(
                        d.id,
                        choice.not_found,
                        now=self.context.clock.now(),
                        error=choice.recorded_as,
                    )
                    claim = replace(claim, doubtful=())
                if choice.finish is not None:
                    await self._commit(log, claim, choice.finish)
                    return
            await self._send(log, claim, channel, home.chain)
        except Exception as exc:  # a bug or a store failure: leave the lease to expire
            self.context.stats.errors += 1
            log.exception("delivery_error", error=str(exc))
            self.context.spans.outcome("error", error=str(exc))

    async def _refuse(self, log: Any, claim: Claim, what: str) -> None:
        """Not sent by this worker, which lacks ``what``: retried (another worker, or
        this one once configured, takes it), a dead letter when the attempts are over."""
        error = f"{what} is not configured on {self.context.worker_id}"
        log.warning("not_configured", error=error)
        await self._commit(log, claim, self.context.decide.retry(claim, None, error))

    async def _seal(self, log: Any, claim: Claim) -> Claim | None:
        """The claim with its digest's payload (``Prepare.seal``); None: ended here."""
        sealed = await self.prepare.seal(claim)
        if isinstance(sealed, Finish):
            log.error("digest_not_composed", error=sealed.error)
            await self._commit(log, claim, sealed)
            return None
        if sealed is None:
            self.context.stats.claims_lost += 1
            log.warning("claim_lost", reason="claim token no longer holds; nothing was sent")
            self.context.spans.outcome("claim_lost")
            return None
        log.info("digest_sealed", payload_hash=sealed.delivery.payload_hash[:12])
        return sealed

    def _routed(self, log: Any, home: str, way: Route) -> None:
        """Log and count a failover (the route moved on from a channel that certainly
        did not accept the delivery)."""
        if way.why == "failover":
            log.info("failover", from_channel=way.previous, to=way.to)
            if self.context.metrics is not None:
                self.context.metrics.failover(home, way.to)

    async def _in_doubt(self, log: Any, claim: Claim, channel: Channel) -> InDoubt:
        """docs/design.md, step 4: an earlier request may have reached the provider. Ask the
        provider when it can be asked; ``Decisions.in_doubt`` decides (its ``finish``
        None: send; with ``not_found``, the earlier requests out of doubt)."""
        self.context.stats.in_doubt_seen += 1
        # nothing to ask where no earlier request can have had an effect (in-commit)
        ask = asks_provider(channel) and self.context.decide.may_have_arrived(claim)
        lookup = await self._lookup(claim, channel) if ask else None
        choice = self.context.decide.in_doubt(claim, channel, lookup)
        choice.tell(log)
        return choice

    @staticmethod
    async def _lookup(claim: Claim, channel: Channel) -> Lookup:
        """Ask the provider whether it already has the delivery's key."""
        provider = channel.provider
        assert isinstance(provider, Reconcilable)
        try:
            return Lookup(found=await provider.lookup(claim.delivery.idempotency_key))
        except Exception as exc:
            return Lookup(error=exc)

    # -- steps 5 to 7 ------------------------------------------------------------------

    async def _send(self, log: Any, claim: Claim, channel: Channel, chain: tuple[str, ...]) -> None:
        """docs/design.md, step 5: commit the intent, then send within its bound (``_request``),
        or record that nothing was sent (``_not_sent``). ``channel``: the one routed to;
        ``chain``: the delivery's channel and its fallbacks."""
        job = claim.job
        request_id = new_request_id()
        log = log.bind(provider_request_id=request_id)
        timeout = request_timeout(channel, self.context.settings)
        # The same bound on this host's monotonic clock, from before the claim was asked
        # for: earlier than the stored deadline, whatever this host's wall clock says.
        deadline = (
            self.context.in_flight.claimed_at(job.id, self.context.monotonic())
            + self.context.settings.send_within
        )
        later = await self.prepare.pace(claim, channel, deadline)
        if later is not None:  # the channel's rate: its next slot is too far for this claim
            log.info("rate_wait", error=later.error)
            await self._commit(log, claim, later)
            return
        paced = self.context.monotonic()  # the channel's rate slot, when it has one, is now
        intent = self._intent(claim, channel, request_id, timeout)
        if not await self._intents.submit(intent):
            self.context.stats.claims_lost += 1
            log.warning("claim_lost", reason="claim token no longer holds; nothing was sent")
            self.context.spans.outcome("claim_lost")
            return
        written = self.context.monotonic()
        metrics = self.context.metrics
        if metrics is not None and claim.prior_requests == 1:
            metrics.multi_request(claim.delivery.channel)  # its second request: counted once
        await self._checkpoint("before_provider_request", claim, provider_request_id=request_id)
        late = self._too_late(job.id, deadline)
        if late is None and self.context.monotonic() - written > RECHECK_AFTER:
            late = await self._revoked(claim)
        if late is not None:  # the bound of the intent: nothing leaves after it
            await self._not_sent(log, claim, request_id, late)
            return
        if channel.rate is not None and self.context.monotonic() - paced > rate_slack(channel.rate):
            # a pause since its slot: sent now, it would crowd the next slot's request
            await self._not_sent(
                log, claim, request_id, "its request-rate slot passed", later=1.0 / channel.rate
            )
            return
        message = self._message(claim, request_id)
        await self._request(log, claim, channel, message, timeout, chain)

    def _intent(self, claim: Claim, channel: Channel, request_id: str, timeout: float) -> Intent:
        """The write-ahead attempt row: no request of it leaves after ``send_deadline``
        (the claim's store time + ``send_within``) and none lands after ``settles_at``."""
        d, job = claim.delivery, claim.job
        lag = float(getattr(channel.provider, "lookup_lag", 0.0) or 0.0)
        send_deadline = claim.now + self.context.settings.send_within
        return Intent(
            delivery_id=d.id,
            job_id=job.id,
            token=claim.token,
            number=job.attempts,
            provider_request_id=request_id,
            worker_id=self.context.worker_id,
            requested_at=self.context.clock.now(),
            send_deadline=send_deadline,
            settles_at=send_deadline + timeout + lag + self.context.settings.settle_allowance,
            provider=channel.name,
        )

    async def _revoked(self, claim: Claim) -> str | None:
        """After a pause between the intent and the request (longer than
        ``RECHECK_AFTER``): renew the lease, and say why nothing may leave when the
        claim was revoked meanwhile (a provider's callback ended the delivery, the
        reaper, an operator) or the store cannot tell."""
        lease = Lease(job_id=claim.job.id, delivery_id=claim.delivery.id, token=claim.token)
        for tries_left in (1, 0):  # a renewal is idempotent: once more on a fresh connection
            try:
                [held] = await self.context.store.heartbeat(
                    [lease], now=self.context.clock.now(), lease=self.context.settings.lease
                )
                break
            except StoreError as exc:  # a connection lost in the pause (a failover, say)
                if not tries_left:
                    return f"the claim could not be confirmed after a pause: {exc}"
        if not held:
            self.context.in_flight.lose(claim.job.id)
            return "the claim was revoked before the request left"
        return None

    def _too_late(self, job_id: int, deadline: float) -> str | None:
        """Why a committed intent must not be sent any more, if it must not."""
        if self.context.in_flight.is_lost(job_id):
            return "the lease was taken over before the request left"
        if self.context.monotonic() > deadline:
            return "the intent's send deadline passed before the request left"
        return None

    async def _not_sent(
        self, log: Any, claim: Claim, request_id: str, late: str, *, later: float | None = None
    ) -> None:
        """A committed intent whose request never left: a retry, certainly not sent
        (``later``: in that many seconds, the claim not counted as an attempt)."""
        self.context.stats.not_sent += 1
        log.warning("not_sent", reason=late)
        outcome = AttemptOutcome(
            provider_request_id=request_id,
            status=AttemptStatus.FAILED_TRANSIENT,
            provider_message_id=None,
            error=f"not sent: {late}",
            completed_at=self.context.clock.now(),
        )
        if later is not None:
            finish = self.context.decide.put_back(claim, outcome, outcome.error, delay=later)
        else:
            finish = self.context.decide.retry(claim, outcome, outcome.error)
        await self._commit(log, claim, finish)

    @staticmethod
    def _message(claim: Claim, request_id: str) -> Message:
        """What the provider is sent: the delivery, its key and our request id."""
        d = claim.delivery
        return Message(
            delivery_id=d.id,
            idempotency_key=d.idempotency_key,
            provider_request_id=request_id,
            event_id=d.event_id,
            recipient=d.recipient,
            channel=d.channel,
            payload=d.payload,
            attempt=claim.job.attempts,
            type=d.type,
            recipient_id=d.recipient_id,
        )

    async def _request(
        self,
        log: Any,
        claim: Claim,
        channel: Channel,
        message: Message,
        limit: float,
        chain: tuple[str, ...] = (),
    ) -> None:
        """The provider request (step 5), cut off after ``limit`` seconds, and what its
        answer means (step 7), committed."""
        metrics = self.context.metrics
        log.info("provider_request", provider=channel.name)
        self.context.stats.requests += 1
        started = self.context.clock.now()
        t0 = time.perf_counter() if metrics is not None else 0.0
        status, sent, error = await self.context.spans.request(
            claim.job.id, self.context.worker_id, message, self.call(channel, message, limit)
        )
        answered = time.perf_counter() if metrics is not None else 0.0
        latency = self.context.clock.now() - started
        if metrics is not None:
            metrics.provider_response(message.channel, status, answered - t0)
        message_id = sent.provider_message_id if sent else None
        log.info(
            "provider_response",
            result=RESULT[status],
            provider_message_id=message_id,
            latency_s=round(latency, 6),
            error=None if error is None else str(error),
        )
        request_id = message.provider_request_id
        await self._checkpoint("after_provider_response", claim, provider_request_id=request_id)
        outcome = AttemptOutcome(
            provider_request_id=request_id,
            status=status,
            provider_message_id=stored_message_id(message_id),
            error=None if error is None else stored_text(str(error)),
            completed_at=self.context.clock.now(),
        )
        finish = self.context.decide.after_request(claim, channel, outcome, error, chain)
        if sent is not None and sent.feed is not None:  # the inbox: written in this commit
            finish = replace(finish, feed=sent.feed)
        await self._commit(log, claim, finish, answered=answered)
        if isinstance(error, DeadAddress):  # the service says the token is gone
            await self._retire_dead_address(log, channel, error)

    async def _retire_dead_address(self, log: Any, channel: Channel, error: DeadAddress) -> None:
        """Retire the address a service called dead (``kirim.addresses``): no later
        delivery uses it. A failure here only logs: the next send to it retires it."""
        try:
            count = await self.context.store.retire_address(
                channel.name,
                error.address,
                reason=stored_text(str(error)) or "dead",
                now=self.context.clock.now(),
            )
        except StoreError as exc:
            log.warning("address_retire_failed", error=str(exc))
            return
        log.info("address_retired", provider=channel.name, retired=count)

    async def call(
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

    # -- step 6 ------------------------------------------------------------------------

    async def _commit(
        self, log: Any, claim: Claim, finish: Finish, *, answered: float | None = None
    ) -> None:
        """docs/design.md, step 6: one transaction, fenced by the token; retried on store errors.

        ``answered``: ``time.perf_counter()`` when the provider answered (for metrics).
        """
        await self._checkpoint("before_commit", claim)
        self.context.in_flight.finishing(claim.job.id)
        for attempt in range(5):
            try:
                result = await self._finishes.submit(finish)
                break
            except StoreError as exc:
                log.warning("commit_retry", error=str(exc), try_=attempt + 1)
                await asyncio.sleep(0.05 * 2**attempt)
        else:
            log.error("commit_failed", reason="the lease will expire and the reaper takes over")
            self.context.spans.outcome("commit_failed")
            return
        if self.context.metrics is not None:
            _measure(self.context.metrics, claim, finish, result, answered)
        self.context.spans.committed(result)
        if result.feed_item is not None and finish.feed is not None:
            log.info("feed_written", feed_item=result.feed_item)
            if self.context.on_feed is not None:
                self.context.on_feed(finish.feed.recipient_id, "new", result.feed_item)
        if result.committed:
            self.context.stats.count(result.delivery_status, result.job_status, finish)
        elif result.late_success:
            self.context.stats.late_successes += 1
        else:
            self.context.stats.stale_rejected += 1
        _tell(log, finish, result)

    async def _checkpoint(self, name: str, claim: Claim, **context: Any) -> None:
        if self.checkpoints is not None:
            await self.checkpoints.hit(
                name,
                worker_id=self.context.worker_id,
                delivery_id=claim.delivery.id,
                job_id=claim.job.id,
                **context,
            )


def _tell(log: Any, finish: Finish, result: FinishResult) -> None:
    """The log lines of a commit: what it wrote, or why it was rejected."""
    if result.committed:
        log.info(
            "db_update",
            status=str(result.delivery_status),
            job_status=str(result.job_status),
            doubt=None if result.doubt is None else str(result.doubt),
            error=result.error,
        )
        if result.job_status is JobStatus.RETRY_SCHEDULED:
            delay = finish.delay
            log.info("retry_scheduled", delay_s=None if delay is None else round(delay, 3))
        elif result.job_status is JobStatus.DEAD:
            log.warning("dead_lettered", error=finish.error)
    elif result.late_success:
        log.warning("stale_write_rejected", late_success=True, status="sent")
    elif result.reopened:
        log.warning(
            "stale_write_rejected",
            late_failure=True,
            status=str(result.delivery_status),
            reason="a late refusal withdrew the assumption that it was sent",
        )
    else:
        log.warning("stale_write_rejected", reason="claim token no longer holds")


def _measure(
    metrics: Metrics,
    claim: Claim,
    finish: Finish,
    result: FinishResult,
    answered: float | None,
) -> None:
    """The metrics of a commit: provider-to-commit lag, stale writes, retries, dead letters."""
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
