"""What an outcome means for a delivery and its job (DESIGN.md, worker step 7).

Pure decisions: each returns the ``Finish`` a worker commits, fenced by its token.
Statuses never claim more certainty than kirim has: attempts that run out while an
earlier request may have arrived end ``in_doubt`` (held), never a plain ``failed``.
Text from outside (errors, provider answers) is made fit for the ledger here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kirim.channels import Channel
from kirim.clock import Clock
from kirim.errors import TransientFailure
from kirim.model import AttemptStatus, DeliveryStatus, Doubt, JobStatus, OnUnknown
from kirim.store.base import AttemptOutcome, Claim, Finish
from kirim.text import stored_text
from kirim.worker.settings import WorkerSettings


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
            return self.retry(claim, outcome, outcome.error, exhausted_status="in_doubt")
        if channel.on_unknown is OnUnknown.HOLD:
            return self.hold(claim, f"held: {outcome.error}", outcome=outcome)
        return self.final(
            claim,
            DeliveryStatus.SENT,
            outcome=outcome,
            doubt=Doubt.ASSUMED_SENT,
            error=outcome.error,
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
        exhausted_status: str = "failed",
    ) -> Finish:
        """Try again after a backoff; when the attempts are over, a dead letter: held in
        doubt if this or an earlier request may have arrived, else failed."""
        job = claim.job
        if job.attempts >= job.max_attempts:
            doubtful = bool(claim.doubtful) or (
                outcome is not None and outcome.status is AttemptStatus.UNKNOWN
            )
            if exhausted_status == "in_doubt" or doubtful:
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
