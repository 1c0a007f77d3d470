"""What an outcome means for a delivery and its job (DESIGN.md, worker steps 4 and 7).

Pure decisions: each returns the ``Finish`` a worker commits, fenced by its token.
Statuses never claim more certainty than kirim has: attempts that run out while an
earlier request may have arrived end ``in_doubt`` (held), never a plain ``failed``.
Text from outside (errors, provider answers) is made fit for the ledger here.

- ``Decisions.after_request``: what a provider's answer means (step 7);
- ``Decisions.in_doubt``: the in-doubt policy, before a request is sent again while an
  earlier one may have reached the provider (step 4); the worker asks the provider
  first when ``asks_provider`` (its answer is a ``Lookup``), and logs the ``InDoubt``;
- ``final``, ``hold``, ``retry``, ``wait_until_settled``: the ``Finish`` of each end.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal

from kirim.channels import Channel
from kirim.clock import Clock
from kirim.errors import TransientFailure
from kirim.model import AttemptStatus, DeliveryStatus, Doubt, JobStatus, OnUnknown
from kirim.providers.base import Reconcilable, Sent
from kirim.store.base import AttemptOutcome, Claim, Finish
from kirim.text import stored_text
from kirim.worker.settings import WorkerSettings

#: where a retry that has run out of attempts leaves its delivery
Exhausted = Literal[DeliveryStatus.FAILED, DeliveryStatus.IN_DOUBT]

#: the in-doubt policy's choice, as the ``in_doubt`` log line names it
InDoubtDecision = Literal[
    "lookup_failed",  # the provider could not be asked: retry later
    "reconciled_sent",  # the provider has it: sent
    "wait_until_settled",  # "not found" proves nothing yet: wait for the earlier requests
    "lookup_not_found_send",  # the provider has not got it: send
    "resend_same_key",  # the provider deduplicates by key: send again, safely
    "resend_at_least_once",  # ``on_unknown = "retry"``: send again
    "hold",  # ``on_unknown = "hold"``: in doubt, for an operator
    "assume_sent",  # ``on_unknown = "assume_sent"``: sent (at most once)
]


@dataclass(frozen=True, slots=True)
class Lookup:
    """The provider's answer to ``lookup(key)``: what it found (None: not found), or
    the failure that stopped the question."""

    found: Sent | None = None
    error: Exception | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InDoubt:
    """The in-doubt policy's choice: the ``Finish`` to commit (None: send now), and
    what the ``in_doubt`` log line says about it."""

    decision: InDoubtDecision
    finish: Finish | None
    #: logged as a warning (else as info)
    warn: bool
    #: the log line's fields after ``decision``
    fields: dict[str, Any] = field(default_factory=dict)
    #: an idempotent provider's dedup window is over: it forgot the key (said first)
    key_forgotten: bool = False

    def tell(self, log: Any) -> None:
        """Write the ``in_doubt`` log lines of this choice to ``log``."""
        if self.key_forgotten:
            log.warning(
                "in_doubt",
                decision="key_forgotten",
                earlier_requests=self.fields["earlier_requests"],
            )
        say = log.warning if self.warn else log.info
        say("in_doubt", decision=self.decision, **self.fields)


def asks_provider(channel: Channel) -> bool:
    """Whether the in-doubt policy asks the provider (``lookup``) before it decides."""
    return bool(channel.lookup) and isinstance(channel.provider, Reconcilable)


@dataclass(slots=True, kw_only=True)
class Decisions:
    settings: WorkerSettings
    clock: Clock
    rng: random.Random

    def after_request(
        self, claim: Claim, channel: Channel, outcome: AttemptOutcome, error: Exception | None
    ) -> Finish:
        """DESIGN step 7: what the outcome means for the delivery and the job."""
        if outcome.status is AttemptStatus.SUCCEEDED:
            return self.final(
                claim, DeliveryStatus.SENT, outcome=outcome, message_id=outcome.provider_message_id
            )
        if outcome.status is AttemptStatus.FAILED_PERMANENT:
            if claim.doubtful:  # this one was refused; an earlier one may have arrived
                return self.hold(
                    claim,
                    f"refused, after an earlier request in doubt: {outcome.error}",
                    outcome=outcome,
                )
            return self.final(
                claim,
                DeliveryStatus.FAILED,
                outcome=outcome,
                job=JobStatus.DEAD,
                error=outcome.error,
            )
        if outcome.status is AttemptStatus.FAILED_TRANSIENT:
            after = error.retry_after if isinstance(error, TransientFailure) else None
            return self.retry(claim, outcome, outcome.error, retry_after=after)
        # Unknown: the provider may have acted on it.
        if channel.idempotent or channel.lookup or channel.on_unknown is OnUnknown.RETRY:
            return self.retry(claim, outcome, outcome.error, exhausted=DeliveryStatus.IN_DOUBT)
        if channel.on_unknown is OnUnknown.HOLD:
            return self.hold(claim, f"held: {outcome.error}", outcome=outcome)
        return self.final(
            claim,
            DeliveryStatus.SENT,
            outcome=outcome,
            doubt=Doubt.ASSUMED_SENT,
            error=outcome.error,
        )

    def in_doubt(self, claim: Claim, channel: Channel, lookup: Lookup | None) -> InDoubt:
        """DESIGN step 4: an earlier request may have reached the provider. ``lookup``:
        the provider's answer when it was asked (``asks_provider``), else None."""
        earlier = [a.provider_request_id for a in claim.doubtful]
        if lookup is not None:
            return self._after_lookup(claim, lookup, earlier)
        said = {"earlier_requests": earlier}
        forgotten = channel.dedup_window is not None and any(
            a.requested_at < claim.now - channel.dedup_window for a in claim.doubtful
        )
        if channel.idempotent and not forgotten:
            return InDoubt(decision="resend_same_key", finish=None, warn=False, fields=said)
        # past its dedup window an idempotent provider forgot the key: as if it had none
        forgot = channel.idempotent
        if channel.on_unknown is OnUnknown.RETRY:
            return InDoubt(
                decision="resend_at_least_once",
                finish=None,
                warn=True,
                fields=said,
                key_forgotten=forgot,
            )
        if channel.on_unknown is OnUnknown.HOLD:
            held = self.hold(claim, "held: an earlier request may have been delivered")
            return InDoubt(
                decision="hold", finish=held, warn=True, fields=said, key_forgotten=forgot
            )
        assumed = self.final(claim, DeliveryStatus.SENT, doubt=Doubt.ASSUMED_SENT)
        return InDoubt(
            decision="assume_sent", finish=assumed, warn=True, fields=said, key_forgotten=forgot
        )

    def _after_lookup(self, claim: Claim, lookup: Lookup, earlier: list[str]) -> InDoubt:
        """The in-doubt policy of a provider that was asked whether it has the key."""
        if lookup.error is not None:
            return InDoubt(
                decision="lookup_failed",
                finish=self.retry(claim, None, f"lookup failed: {lookup.error}"),
                warn=True,
                fields={"error": str(lookup.error)},
            )
        if lookup.found is not None:
            message_id = lookup.found.provider_message_id
            return InDoubt(
                decision="reconciled_sent",
                finish=self.final(
                    claim, DeliveryStatus.SENT, doubt=Doubt.RESOLVED, message_id=message_id
                ),
                warn=False,
                fields={"earlier_requests": earlier, "provider_message_id": message_id},
            )
        if claim.unsettled_until is not None:
            # "Not found" proves nothing while an earlier request may still land.
            return InDoubt(
                decision="wait_until_settled",
                finish=self.wait_until_settled(claim, claim.unsettled_until),
                warn=False,
                fields={"earlier_requests": earlier, "until": round(claim.unsettled_until, 3)},
            )
        return InDoubt(
            decision="lookup_not_found_send",
            finish=None,
            warn=False,
            fields={"earlier_requests": earlier},
        )

    def final(
        self,
        claim: Claim,
        status: DeliveryStatus,
        *,
        outcome: AttemptOutcome | None = None,
        doubt: Doubt | None = None,
        message_id: str | None = None,
        job: JobStatus = JobStatus.COMPLETED,
        error: str | None = None,
    ) -> Finish:
        return Finish(
            delivery_id=claim.delivery.id,
            job_id=claim.job.id,
            token=claim.token,
            now=self.clock.now(),
            attempt=outcome,
            delivery_status=status,
            doubt=doubt,
            provider_message_id=stored_text(message_id),
            error=stored_text(error),
            job_status=job,
        )

    def hold(self, claim: Claim, error: str, *, outcome: AttemptOutcome | None = None) -> Finish:
        return self.final(
            claim,
            DeliveryStatus.IN_DOUBT,
            outcome=outcome,
            doubt=Doubt.HELD,
            job=JobStatus.DEAD,
            error=error,
        )

    def retry(
        self,
        claim: Claim,
        outcome: AttemptOutcome | None,
        error: str | None,
        *,
        retry_after: float | None = None,
        exhausted: Exhausted = DeliveryStatus.FAILED,
    ) -> Finish:
        """Try again after a backoff; when the attempts are over, a dead letter: held in
        doubt if this or an earlier request may have arrived (or ``exhausted`` says so),
        else failed."""
        job = claim.job
        if job.attempts >= job.max_attempts:
            doubtful = bool(claim.doubtful) or (
                outcome is not None and outcome.status is AttemptStatus.UNKNOWN
            )
            if exhausted is DeliveryStatus.IN_DOUBT or doubtful:
                return self.hold(claim, f"attempts exhausted: {error}", outcome=outcome)
            return self.final(
                claim,
                DeliveryStatus.FAILED,
                outcome=outcome,
                job=JobStatus.DEAD,
                error=f"attempts exhausted: {error}",
            )
        delay = self.backoff(job.attempts)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return Finish(
            delivery_id=claim.delivery.id,
            job_id=job.id,
            token=claim.token,
            now=self.clock.now(),
            attempt=outcome,
            delivery_status=DeliveryStatus.PENDING,
            error=stored_text(error),
            job_status=JobStatus.RETRY_SCHEDULED,
            delay=delay,  # from the commit, in the store's time
        )

    def wait_until_settled(self, claim: Claim, until: float) -> Finish:
        """Put the job back until ``until`` (store time), when no earlier request can
        still land; the claim does not count as an attempt."""
        return Finish(
            delivery_id=claim.delivery.id,
            job_id=claim.job.id,
            token=claim.token,
            now=self.clock.now(),
            attempt=None,
            delivery_status=DeliveryStatus.PENDING,
            error="waiting until no earlier request can still land",
            job_status=JobStatus.RETRY_SCHEDULED,
            run_at=until,
            refund_attempt=True,
        )

    def backoff(self, attempts: int) -> float:
        """Exponential backoff with full jitter."""
        cap = min(self.settings.backoff_max, self.settings.backoff_base * 2 ** (attempts - 1))
        return self.rng.uniform(0, cap)
