"""The rules of the delivery state machine, written once for both backends (no I/O).

What status follows what, when a success outranks a failure, when a doubt decision
loses its premise, when a late refusal withdraws an assumption, whether a recipient's
preferences still let a claimed delivery go: pure functions of the rows a transition
read under its locks (``transitions`` does the reading and writing).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kirim.model import (
    CONFIRMED_DELIVERY,
    Attempt,
    AttemptStatus,
    CallbackStatus,
    Delivery,
    DeliveryStatus,
    Doubt,
    Job,
    JobStatus,
)
from kirim.preferences import Preferences, Reason, TypePolicy, Verdict, decide
from kirim.store.base import AttemptOutcome, Callback, ClaimKind, Finish, QueueStats
from kirim.store.rows import Row, evolve


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
    reason: str | None = None

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
            reason=it.reason,
        )

    def outranked_by(self, success_message_id: str | None) -> Written:
        """A success recorded by any attempt (even a stale one) outranks a failure."""
        return evolve(
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

    def without_doubt(self, it: Finish, now: float, job: Job | None) -> Written:
        """Every earlier request was refused: without a request of its own, send again
        (the claim does not count); after a refusal of its own, as a withdrawn
        assumption goes (``withdrawn``): back to the worker while the job has attempts
        left, which routes it from the attempts (a fallback channel when this one
        refused for good), else failed."""
        if it.attempt is None:
            return evolve(
                self,
                status=DeliveryStatus.PENDING,
                doubt=None,
                job_status=JobStatus.RETRY_SCHEDULED,
                run_at=now,
                refund=True,
                error="the earlier requests were refused meanwhile: sending again",
            )
        status, job_status = withdrawn(it.attempt, job)
        if job_status is JobStatus.RETRY_SCHEDULED:
            return evolve(
                self,
                status=status,
                doubt=None,
                job_status=job_status,
                run_at=now,
                error=f"{it.attempt.error}; the earlier requests were refused meanwhile",
            )
        return evolve(self, status=DeliveryStatus.FAILED, doubt=None, job_status=JobStatus.DEAD)


def plain(it: Finish) -> bool:
    """A finish that no other row can change: sent by its own success (or with no
    request), with no doubt decision and no refund. Its claim's token decides alone."""
    return (
        it.delivery_status is DeliveryStatus.SENT
        and it.doubt is None
        and not it.refund_attempt
        and (it.attempt is None or it.attempt.status is AttemptStatus.SUCCEEDED)
    )


def withdrawn(refusal: AttemptOutcome | None, job: Job | None) -> tuple[DeliveryStatus, JobStatus]:
    """Where a withdrawn assumption goes: back to the worker while its job has attempts
    left, which routes it from the attempts (a permanent refusal moves it on to a
    fallback channel, or fails it when every channel refused for good:
    ``kirim.worker.decisions.route``); else failed."""
    del refusal  # the worker reads the refusal from the attempt it completed
    if job is not None and job.attempts < job.max_attempts:
        return DeliveryStatus.PENDING, JobStatus.RETRY_SCHEDULED
    return DeliveryStatus.FAILED, JobStatus.DEAD


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


# -- the claim, late results, reaping and the operator's verbs ---------------------------

#: Job statuses that still carry a delivery (a dead letter may be retried).
CARRYING = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.RETRY_SCHEDULED, JobStatus.DEAD)
V = TypeVar("V")
_MAYBE_SENT = (AttemptStatus.REQUESTED, AttemptStatus.UNKNOWN)


def first_of(value: V | None, other: V | None) -> V | None:
    """``value`` unless it is None (SQL's COALESCE)."""
    return other if value is None else value


def doubtful(attempts: Iterable[Attempt], released_at: float | None) -> list[Attempt]:
    """The attempts that may have reached the provider, since the operator's last release
    (a retry by the operator releases the doubt of the requests before it)."""
    since = released_at or 0.0
    return [a for a in attempts if a.status in _MAYBE_SENT and a.requested_at >= since]


#: why a request of an in-commit channel (the inbox) whose commit never came is not in
#: doubt (what ``transitions.not_found`` records): its effect is that commit, made only
#: under a holding claim
UNWRITTEN = "not written: its claim was lost before the commit that writes the message"


def may_have_arrived(
    doubtful: Iterable[Attempt], home: str, in_commit: Collection[str]
) -> list[Attempt]:
    """Of the requests that may have reached the provider (``doubtful``), those that
    may have had an effect: not those of a channel whose effect is its finish's own
    commit (``in_commit``: the inbox), which wrote nothing when that commit never came
    and can write nothing later (a commit whose claim no longer holds writes nothing).
    ``home``: the delivery's channel (a request with no provider named went there)."""
    return [a for a in doubtful if (a.provider or home) not in in_commit]


def since_release(attempts: Iterable[Attempt], released_at: float | None) -> list[Attempt]:
    """The attempts since the operator's last release (a retry by the operator starts
    the delivery over: its failover route too)."""
    since = released_at or 0.0
    return [a for a in attempts if a.requested_at >= since]


def first_success(attempts: Iterable[Attempt]) -> Attempt | None:
    """The earliest attempt that succeeded, if any."""
    found = [a for a in attempts if a.status is AttemptStatus.SUCCEEDED]
    return min(found, key=lambda a: a.id) if found else None


def claim_kind(d: Delivery, now: float) -> ClaimKind:
    """What a due job may do with its delivery: claim it (pending, or processing whose
    claim expired or was revoked), leave it to the worker that holds it (busy), or
    nothing (the delivery is already final)."""
    if d.status is DeliveryStatus.PENDING:
        return ClaimKind.CLAIMED
    if d.status is DeliveryStatus.PROCESSING:
        expired = d.claim_expires_at is None or d.claim_expires_at < now
        return ClaimKind.CLAIMED if expired else ClaimKind.BUSY
    return ClaimKind.NOOP


def recipients_to_check(
    claimed: Iterable[Delivery | None], policies: Mapping[str, TypePolicy] | None
) -> list[str]:
    """The recipients whose preferences the claim-time check of ``claimed`` reads."""
    if not policies:
        return []
    found = {d.recipient_id for d in claimed if d is not None and d.type in policies}
    return sorted(r for r in found if r is not None)


def preference_check(
    d: Delivery,
    policies: Mapping[str, TypePolicy] | None,
    prefs: Mapping[str, Preferences],
    now: float,
) -> Verdict | None:
    """The claim-time check: what the recipient's preferences say now about a delivery
    of a type in ``policies`` (``kirim.preferences.decide``); None when it goes (or is
    no such delivery). A preference changed since the enqueue wins. The caller does not
    suppress a delivery that an earlier request may have reached (that would claim it
    was never sent): it withholds it (``Claim.withheld``)."""
    policy = None if not policies or d.type is None else policies.get(d.type)
    if policy is None:
        return None
    found = None if d.recipient_id is None else prefs.get(d.recipient_id)
    verdict = decide(policy, d.channel, found, now)
    return None if verdict.action == "send" else verdict


def suppressed(d: Delivery, reason: Reason, now: float) -> Delivery:
    """The delivery stopped by its recipient's preferences: final, with the reason."""
    return unclaimed(d, status=DeliveryStatus.SUPPRESSED, reason=str(reason), updated_at=now)


def unclaimed(d: Delivery, **changes: Any) -> Delivery:
    """The delivery with its claim given up (and ``changes``)."""
    return evolve(d, claim_token=None, claimed_by=None, claim_expires_at=None, **changes)


def unleased(j: Job, **changes: Any) -> Job:
    """The job with its lease given up (and ``changes``)."""
    return evolve(j, lease_owner=None, lease_token=None, lease_expires_at=None, **changes)


def revoked(d: Delivery, now: float) -> Delivery:
    """The delivery's claim revoked (reaped, or given back at shutdown): its holder's
    token stops working, and the next claimer takes over at once."""
    return evolve(d, claim_token=None, claim_expires_at=None, updated_at=now)


def sent_late(d: Delivery, message_id: str | None, now: float) -> Delivery:
    """A success reported after the claim was lost still makes the delivery sent (one
    the provider already said delivered or bounced keeps the provider's word)."""
    if d.status in CONFIRMED_DELIVERY:
        return unclaimed(
            d, provider_message_id=first_of(d.provider_message_id, message_id), updated_at=now
        )
    return unclaimed(
        d,
        status=DeliveryStatus.SENT,
        provider_message_id=first_of(d.provider_message_id, message_id),
        doubt=None if d.doubt is None else Doubt.RESOLVED,
        sent_at=d.sent_at if d.sent_at is not None else now,
        updated_at=now,
    )


def committed_columns(before: Mapping[str, Any], w: Written, now: float) -> dict[str, Any]:
    """The delivery's columns as a claim's own finish writes them (the claim ends), from
    the columns ``before`` it: the one rule of the commit, for model values
    (``committed``) and for rows (the plain finish)."""
    return {
        "status": w.status,
        "doubt": w.doubt,
        "claim_token": None,
        "claimed_by": None,
        "claim_expires_at": None,
        "provider_message_id": first_of(w.message_id, before["provider_message_id"]),
        "last_error": w.error,
        "sent_at": now if w.status is DeliveryStatus.SENT else before["sent_at"],
        "reason": first_of(w.reason, before["reason"]),
        "updated_at": now,
    }


def job_committed_columns(before: Mapping[str, Any], w: Written, now: float) -> dict[str, Any]:
    """The job's columns as a claim's own finish writes them (its lease ends)."""
    return {
        "status": w.job_status,
        "run_at": before["run_at"] if w.run_at is None else w.run_at,
        "last_error": w.error,
        "attempts": before["attempts"] - int(w.refund),
        "lease_owner": None,
        "lease_token": None,
        "lease_expires_at": None,
        "updated_at": now,
    }


def committed_row(before: Mapping[str, Any], w: Written, now: float) -> dict[str, Any]:
    """``committed_columns`` as a row holds them: its two statuses (the only enum
    members) as their strings."""
    values = committed_columns(before, w, now)
    values["status"] = str(w.status)
    values["doubt"] = None if w.doubt is None else str(w.doubt)
    return values


def job_committed_row(before: Mapping[str, Any], w: Written, now: float) -> dict[str, Any]:
    """``job_committed_columns`` as a row holds them (its status the only enum member)."""
    values = job_committed_columns(before, w, now)
    values["status"] = str(w.job_status)
    return values


def committed(d: Delivery, w: Written, now: float) -> Delivery:
    """The delivery as a claim's own finish writes it (``committed_columns``)."""
    return evolve(d, **committed_columns(_columns(d), w, now))


def job_committed(j: Job, w: Written, now: float) -> Job:
    """The job as a claim's own finish writes it (``job_committed_columns``)."""
    return evolve(j, **job_committed_columns(_columns(j), w, now))


def _columns(value: Delivery | Job) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}


def parked(d: Delivery, maybe_sent: bool, now: float) -> Delivery:
    """The delivery of a job that died with its lease: in doubt (held) if a request may
    have left, else failed."""
    return unclaimed(
        d,
        status=DeliveryStatus.IN_DOUBT if maybe_sent else DeliveryStatus.FAILED,
        doubt=Doubt.HELD if maybe_sent else d.doubt,
        last_error="lease expired on the final attempt",
        updated_at=now,
    )


# -- delivery callbacks (the provider's word on its messages) -------------------------


def other_copies(
    d: Delivery, attempts: Iterable[Attempt], confirmations: Mapping[str, Row], message_id: str
) -> bool:
    """Whether another message of ``d`` than ``message_id`` may have been accepted by a
    provider: another message confirmed delivered, or an attempt other than the one that
    carried ``message_id`` that succeeded or may have arrived (requested, unknown). A
    message id no attempt recorded (a callback that overtook the answer) may be any one
    attempt's: then two that may have been accepted are needed."""
    if any(
        m != message_id and r["status"] == CallbackStatus.DELIVERED
        for m, r in confirmations.items()
    ):
        return True
    if d.provider_message_id is not None and d.provider_message_id != message_id:
        return True
    maybe = [a for a in attempts if a.status in (AttemptStatus.SUCCEEDED, *_MAYBE_SENT)]
    carried = [a for a in maybe if a.provider_message_id == message_id]
    return len(maybe) - (len(carried) if carried else min(1, len(maybe))) > 0


def confirmed(
    d: Delivery,
    cb: Callback,
    message_ids: Sequence[str],
    now: float,
    *,
    others: bool = False,
    duplicate: bool = False,
) -> Delivery:
    """The delivery after a provider's callback about one of its messages.

    ``message_ids``: every message id confirmed for it, this one included; ``others``:
    kirim knows another message of it that the provider accepted (``other_copies``);
    ``duplicate``: this callback confirms a second message delivered. The provider's
    word outranks what kirim assumed: delivered once any message was confirmed
    delivered (never taken back: a later bounce of a second copy is recorded, the user
    had the first); bounced (a ``bounced`` or ``failed`` callback: the provider had the
    message and it did not reach the user; kirim never sends it again) only when no
    other accepted message is known: the bounce of one copy while another was accepted
    is recorded, and the delivery stays as it was. A callback that ends the delivery
    resolves any doubt and revokes a claim, so a worker still on it writes nothing and
    sends nothing more. ``last_error`` says why, and names a measured duplicate.
    """
    note: str | None
    if cb.status is CallbackStatus.DELIVERED or d.status is DeliveryStatus.DELIVERED:
        status = DeliveryStatus.DELIVERED
    elif others:  # another copy was accepted: this bounce does not end the delivery
        note = f"a copy {cb.status} (provider callback), another may have reached the user" + (
            f": {cb.reason}" if cb.reason else ""
        )
        return evolve(d, last_error=note, updated_at=now)
    else:
        status = DeliveryStatus.BOUNCED
    if duplicate:
        note = (
            f"measured duplicate: the provider confirmed {len(message_ids)} messages "
            f"for one notification ({', '.join(message_ids)})"
        )
    elif status is DeliveryStatus.BOUNCED:
        note = f"{cb.status} (provider callback)" + (f": {cb.reason}" if cb.reason else "")
    else:
        note = d.last_error if d.status is DeliveryStatus.DELIVERED else None
    return unclaimed(
        d,
        status=status,
        doubt=None if d.doubt is None else Doubt.RESOLVED,
        provider_message_id=first_of(d.provider_message_id, cb.message_id),
        last_error=note,
        sent_at=d.sent_at if d.sent_at is not None else now,
        updated_at=now,
    )


def settled_doubt(d: Delivery) -> Doubt | None:
    """The doubt a provider's callback settles for ``d``, if it is in one."""
    if d.doubt in (Doubt.ASSUMED_SENT, Doubt.HELD):
        return d.doubt
    return Doubt.HELD if d.status is DeliveryStatus.IN_DOUBT else None


def newer_word(old_reported: float | None, new_reported: float | None) -> bool:
    """Whether a callback's word on a message replaces the one recorded: unless both
    say when and the new one happened earlier (callbacks arrive out of order)."""
    return old_reported is None or new_reported is None or new_reported >= old_reported
