"""The state machine of a claim, written once over a backend's named queries.

A backend supplies ``Ops``: run one named query of its own ``queries.sql`` inside
the transaction it opened. Everything here runs inside that one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from kirim.errors import NotSettled
from kirim.keys import new_token
from kirim.model import (
    Attempt,
    AttemptStatus,
    Delivery,
    DeliveryStatus,
    Doubt,
    Job,
    JobStatus,
)
from kirim.store.base import (
    ApiToken,
    AttemptOutcome,
    Claim,
    ClaimKind,
    Finish,
    FinishResult,
    QueueStats,
    Reaped,
    RequestSlot,
    RequestState,
)

Row = Mapping[str, Any]


class Ops(Protocol):
    def one(self, name: str, args: Sequence[Any] | Mapping[str, Any]) -> Row | None: ...

    def all(self, name: str, args: Sequence[Any] | Mapping[str, Any]) -> list[Row]: ...

    def run(self, name: str, args: Sequence[Any] | Mapping[str, Any]) -> int:
        """Execute; return the number of rows changed."""
        ...


def delivery_from(row: Row) -> Delivery:
    payload = row["payload"]
    return Delivery(
        id=row["id"],
        idempotency_key=row["idempotency_key"],
        event_id=row["event_id"],
        recipient=row["recipient"],
        channel=row["channel"],
        payload=json.loads(payload) if isinstance(payload, str) else payload,
        payload_hash=row["payload_hash"],
        status=DeliveryStatus(row["status"]),
        claim_token=row["claim_token"],
        claimed_by=row["claimed_by"],
        claim_expires_at=row["claim_expires_at"],
        provider_message_id=row["provider_message_id"],
        doubt=Doubt(row["doubt"]) if row["doubt"] else None,
        last_error=row["last_error"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        sent_at=row["sent_at"],
    )


def job_from(row: Row) -> Job:
    return Job(
        id=row["id"],
        delivery_id=row["delivery_id"],
        status=JobStatus(row["status"]),
        run_at=row["run_at"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        lease_owner=row["lease_owner"],
        lease_token=row["lease_token"],
        lease_expires_at=row["lease_expires_at"],
        last_error=row["last_error"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def attempt_from(row: Row) -> Attempt:
    return Attempt(
        id=row["id"],
        delivery_id=row["delivery_id"],
        job_id=row["job_id"],
        number=row["number"],
        provider_request_id=row["provider_request_id"],
        worker_id=row["worker_id"],
        status=AttemptStatus(row["status"]),
        provider_message_id=row["provider_message_id"],
        error=row["error"],
        requested_at=row["requested_at"],
        completed_at=row["completed_at"],
        send_deadline=row["send_deadline"],
        settles_at=row["settles_at"],
    )


def claim(ops: Ops, worker_id: str, now: float, lease: float, limit: int) -> list[Claim]:
    """Lease due jobs and claim their deliveries (DESIGN steps 1–3)."""
    until = now + lease
    claims = []
    for due in ops.all("select_due_jobs", (now, limit)):
        token = new_token()
        job_row = ops.one("lease_job", (worker_id, token, until, now, due["id"]))
        if job_row is None:
            continue
        job = job_from(job_row)
        current = delivery_from(_must(ops.one("delivery_by_id", (job.delivery_id,))))
        claims.append(_claim_delivery(ops, job, current, token, worker_id, now, until))
    return claims


def _claim_delivery(
    ops: Ops, job: Job, current: Delivery, token: str, worker_id: str, now: float, until: float
) -> Claim:
    def noop(delivery: Delivery, reason: str) -> Claim:
        ops.run("finish_job", ("completed", None, reason, 0, now, job.id, token))
        return Claim(
            kind=ClaimKind.NOOP, job=job, delivery=delivery, token=token, reason=reason, now=now
        )

    if current.status is not DeliveryStatus.PENDING and current.status is not (
        DeliveryStatus.PROCESSING
    ):
        return noop(current, f"delivery already {current.status}")
    if current.status is DeliveryStatus.PENDING:
        row = ops.one("claim_pending_delivery", (token, worker_id, until, now, job.delivery_id))
    else:
        row = ops.one("take_over_delivery", (token, worker_id, until, now, job.delivery_id, now))
    if row is None:
        retry_at = current.claim_expires_at if current.claim_expires_at is not None else now
        ops.run("release_busy_job", (retry_at, now, job.id, token))
        return Claim(
            kind=ClaimKind.BUSY,
            job=job,
            delivery=current,
            token=token,
            reason=f"delivery claimed by {current.claimed_by}",
            now=now,
        )
    delivery = delivery_from(row)
    # Most claims are a delivery's first: no attempt row, so nothing more to look for.
    prior = int(_must(ops.one("count_attempts", (delivery.id,)))["n"])
    success = ops.one("succeeded_attempt", (delivery.id,)) if prior else None
    if success is not None:
        ops.run("late_success_delivery", (success["provider_message_id"], now, now, delivery.id))
        done = delivery_from(_must(ops.one("delivery_by_id", (delivery.id,))))
        return noop(done, "an earlier attempt succeeded")
    doubtful = (
        tuple(attempt_from(r) for r in ops.all("doubtful_attempts", (delivery.id,)))
        if prior
        else ()
    )
    return Claim(
        kind=ClaimKind.CLAIMED,
        job=job,
        delivery=delivery,
        token=token,
        doubtful=doubtful,
        prior_requests=prior,
        now=now,
        unsettled_until=unsettled_until(doubtful, now),
    )


def unsettled_until(attempts: Sequence[Attempt], now: float) -> float | None:
    """The latest time an earlier request may still land, if that is after ``now``."""
    later = [a.settles_at for a in attempts if not a.settled(now) and a.settles_at is not None]
    return max(later) if later else None


def run_at_of(it: Finish, now: float) -> float | None:
    """When a finished job runs again, in store time (``Finish.run_at`` or ``delay``)."""
    if it.run_at is not None:
        return it.run_at
    return None if it.delay is None else now + it.delay


#: Outcomes that say for certain the request was not acted on.
DEFINITE_FAILURE = (AttemptStatus.FAILED_PERMANENT, AttemptStatus.FAILED_TRANSIENT)


# -- the rules of finish, written once for both backends (no I/O here) -----------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Written:
    """What ``finish`` writes for one item, as the rules below leave it."""

    status: DeliveryStatus
    doubt: Doubt | None
    message_id: str | None
    job_status: JobStatus
    run_at: float | None
    error: str | None
    refund: bool

    @staticmethod
    def of(it: Finish, now: float) -> Written:
        """What the worker decided, with the next run in the store's time."""
        return Written(
            status=it.delivery_status,
            doubt=it.doubt,
            message_id=it.provider_message_id,
            job_status=it.job_status,
            run_at=run_at_of(it, now),
            error=it.error,
            refund=it.refund_attempt,
        )

    def outranked_by(self, success_message_id: str | None) -> Written:
        """A success recorded by any attempt (even a stale one) outranks a failure."""
        return replace(
            self,
            status=DeliveryStatus.SENT,
            job_status=JobStatus.COMPLETED,
            message_id=success_message_id,
            doubt=Doubt.RESOLVED if self.doubt is not None else None,
        )

    def may_have_lost_its_doubt(self, it: Finish) -> bool:
        """A doubt decision (assume sent, hold) made on earlier requests that may all
        have been refused since: the store checks that none is doubtful any more."""
        return self.doubt in (Doubt.ASSUMED_SENT, Doubt.HELD) and (
            it.attempt is None or it.attempt.status in DEFINITE_FAILURE
        )

    def without_doubt(self, it: Finish, now: float) -> Written:
        """Every earlier request was refused: without a request of its own, send again
        (the claim does not count); after a refusal of its own, the attempts are over."""
        if it.attempt is None:
            return replace(
                self,
                status=DeliveryStatus.PENDING,
                doubt=None,
                job_status=JobStatus.RETRY_SCHEDULED,
                run_at=now,
                refund=True,
                error="the earlier requests were refused meanwhile: sending again",
            )
        return replace(self, status=DeliveryStatus.FAILED, doubt=None, job_status=JobStatus.DEAD)


def withdrawable(d: Delivery) -> bool:
    """Whether a delivery rests on an assumption a late refusal can withdraw."""
    assumed = d.status is DeliveryStatus.SENT and d.doubt is Doubt.ASSUMED_SENT
    held = d.status is DeliveryStatus.IN_DOUBT and d.doubt is Doubt.HELD
    return assumed or held


def withdrawn(refusal: AttemptOutcome, job: Job | None) -> tuple[DeliveryStatus, JobStatus]:
    """Where a withdrawn assumption goes: transient, sent again (within the job's
    attempts); permanent, failed."""
    transient = refusal.status is AttemptStatus.FAILED_TRANSIENT
    if transient and job is not None and job.attempts < job.max_attempts:
        return DeliveryStatus.PENDING, JobStatus.RETRY_SCHEDULED
    return DeliveryStatus.FAILED, JobStatus.DEAD


def finish(ops: Ops, it: Finish, now: float | None = None) -> FinishResult:
    """Outcome, delivery status and job state in one go, fenced by the token (step 6).

    ``now``: the store's time (default ``it.now``). Two rules keep a status from
    claiming more than kirim knows: a success recorded by any attempt outranks a
    failure, and a doubt decision (assume sent, hold) whose doubt vanished before its
    commit (every earlier request was answered with a definite failure meanwhile) is
    replaced by a retry. A stale token rejects the transition, but a late answer is
    still a fact: a success marks the delivery sent, a definite failure of the only
    doubtful request withdraws an assumption (``reopen``).
    """
    now = it.now if now is None else now
    if it.attempt is not None:
        a = it.attempt
        ops.run(
            "complete_attempt",
            (str(a.status), a.provider_message_id, a.error, a.completed_at, a.provider_request_id),
        )
    w = Written.of(it, now)
    if w.status is not DeliveryStatus.SENT:
        success = ops.one("succeeded_attempt", (it.delivery_id,))
        if success is not None:
            w = w.outranked_by(success["provider_message_id"])
    if (
        w.may_have_lost_its_doubt(it)
        and not ops.all("doubtful_attempts", (it.delivery_id,))
        and ops.one("succeeded_attempt", (it.delivery_id,)) is None
    ):
        w = w.without_doubt(it, now)
    changed = ops.run(
        "finish_delivery",
        (
            str(w.status),
            None if w.doubt is None else str(w.doubt),
            w.message_id,
            w.error,
            str(w.status),
            now,
            now,
            it.delivery_id,
            it.token,
        ),
    )
    if changed == 1:
        ops.run(
            "finish_job",
            (str(w.job_status), w.run_at, w.error, int(w.refund), now, it.job_id, it.token),
        )
        return FinishResult(committed=True, delivery_status=w.status, job_status=w.job_status)
    # Stale token: the transition is rejected, but a success is a fact worth keeping.
    if it.attempt is not None and it.attempt.status is AttemptStatus.SUCCEEDED:
        ops.run(
            "late_success_delivery",
            (it.attempt.provider_message_id, now, now, it.delivery_id),
        )
        ops.run("late_success_jobs", (now, it.delivery_id))
        return FinishResult(
            committed=False,
            delivery_status=DeliveryStatus.SENT,
            job_status=JobStatus.COMPLETED,
            late_success=True,
        )
    if it.attempt is not None and it.attempt.status in DEFINITE_FAILURE:
        reopened = reopen(ops, it, now)
        if reopened is not None:
            return reopened
    return FinishResult(committed=False, delivery_status=None, job_status=None)


def reopen(ops: Ops, it: Finish, now: float) -> FinishResult | None:
    """A late definite failure of the only doubtful request withdraws an assumption.

    The delivery was marked sent (assumed) or held because that request might have
    arrived; it was refused, so the user has nothing. Transient: the delivery is sent
    again (its latest job is scheduled, within its attempts); permanent: it failed.
    """
    row = ops.one("delivery_by_id", (it.delivery_id,))
    if row is None:
        return None
    d = delivery_from(row)
    if not withdrawable(d) or ops.all("doubtful_attempts", (d.id,)):
        return None
    if ops.one("succeeded_attempt", (d.id,)) is not None:
        return None
    assert it.attempt is not None
    job_row = ops.one("latest_job", (d.id,))
    job = None if job_row is None else job_from(job_row)
    status, job_status = withdrawn(it.attempt, job)
    error = f"late answer: {it.attempt.error}"
    ops.run("reopen_delivery", (str(status), error, now, d.id))
    if job is not None:
        ops.run("reopen_job", (str(job_status), now + (it.delay or 0.0), error, now, job.id))
    return FinishResult(
        committed=False, delivery_status=status, job_status=job_status, reopened=True
    )


def reap(ops: Ops, now: float) -> list[Reaped]:
    """Jobs whose lease expired go back to the queue, or die on their final attempt."""
    out = []
    for row in ops.all("expired_jobs", (now,)):
        dead = row["attempts"] >= row["max_attempts"]
        if dead:
            ops.run("kill_expired_job", (now, row["id"], row["lease_token"]))
            ops.run("park_expired_delivery", (now, row["delivery_id"], row["lease_token"]))
        else:
            ops.run("requeue_expired_job", (now, now, row["id"], row["lease_token"]))
            ops.run("revoke_expired_claim", (now, row["delivery_id"], row["lease_token"]))
        out.append(
            Reaped(
                job_id=row["id"],
                delivery_id=row["delivery_id"],
                attempt=row["attempts"],
                owner=row["lease_owner"],
                dead=dead,
                channel=row["channel"] or "",
            )
        )
    return out


def must_be_settled(ops: Ops, delivery_id: int, now: float, action: str) -> None:
    """Raise ``NotSettled`` while an earlier request of the delivery may still land."""
    attempts = [attempt_from(r) for r in ops.all("doubtful_attempts", (delivery_id,))]
    until = unsettled_until(attempts, now)
    if until is not None:
        raise NotSettled(delivery_id, until, action)


def retry_dead(ops: Ops, delivery_id: int, now: float) -> bool:
    """An operator sends a dead-lettered delivery again, releasing any earlier doubt.

    Not while an earlier request may still land (``NotSettled``): the operator's
    judgement that the user has nothing holds only once nothing more can arrive.
    """
    must_be_settled(ops, delivery_id, now, "retry")
    if ops.run("revive_delivery", (now, now, delivery_id)) != 1:
        return False
    ops.run("bury_dead_jobs", (now, delivery_id))
    ops.one("insert_job_for_retry", (delivery_id, now, now, now, delivery_id))
    return True


def cancel(ops: Ops, delivery_id: int, now: float) -> bool:
    """Cancel a delivery that is neither in flight nor sent.

    Not while an earlier request may still land (``NotSettled``): "canceled" must
    mean that nothing reaches the user.
    """
    must_be_settled(ops, delivery_id, now, "cancel")
    if ops.run("cancel_delivery", {"now": now, "delivery_id": delivery_id}) != 1:
        return False
    ops.run("cancel_jobs", (now, delivery_id))
    return True


def queue_stats(
    by_status_doubt: Sequence[Row], due: int, oldest_run_at: float | None, now: float
) -> QueueStats:
    """``QueueStats`` from (status, doubt, n) rows and the due jobs' count and oldest run_at."""
    deliveries = {str(s): 0 for s in DeliveryStatus}
    in_doubt = 0
    for row in by_status_doubt:
        n = int(row["n"])
        deliveries[row["status"]] = deliveries.get(row["status"], 0) + n
        if row["status"] == DeliveryStatus.IN_DOUBT or row["doubt"] == Doubt.ASSUMED_SENT:
            in_doubt += n
    age = 0.0 if oldest_run_at is None else max(0.0, now - float(oldest_run_at))
    return QueueStats(
        deliveries=deliveries, in_doubt=in_doubt, queue_depth=int(due), oldest_due_age_s=age
    )


def _must(row: Row | None) -> Row:
    if row is None:
        raise LookupError("row vanished inside a transaction")
    return row


def token_from(row: Row) -> ApiToken:
    return ApiToken(
        id=row["id"],
        name=row["name"],
        prefix=row["prefix"],
        created_at=row["created_at"],
        revoked_at=row["revoked_at"],
    )


def request_slot_from(row: Row) -> RequestSlot:
    """What a ``kirim_requests`` row says to a request that did not get its key."""
    return RequestSlot(
        state=RequestState(row["state"]),
        fingerprint=row["fingerprint"],
        status_code=row["status_code"],
        response=row["response"],
    )
