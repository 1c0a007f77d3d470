"""The ledger's transitions, written once for both backends, set-based.

Each is an ``Operation`` (see ``sequence``): one transaction that reads the rows it
will change (PostgreSQL locks them as it reads: jobs before deliveries, each table
in id order, as everywhere), decides with the rules of ``rules``, and writes back
whole batches: one statement per table per batch, whatever the batch's size (SQLite
runs a delivery's per row, setting only the columns that changed from the row read:
``kirim.store.sqlite.changed``).

Rows read under the transaction's locks cannot change before it commits (SQLite
holds the database's write lock; PostgreSQL the rows' locks), so the protocol's
fences (docs/design.md) are checked here, on the rows read: a claim token that no longer
holds rejects a finish, a lease token a heartbeat. The hot single-statement steps
(intents, heartbeats, the plain finish on PostgreSQL) fence in their SQL, where one
statement both checks and writes; the claim of fresh deliveries (``_fresh``) writes
in SQL what ``claim`` would write for a delivery with nothing to decide.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from kirim import machine
from kirim.errors import NotSettled, StoreError
from kirim.inbox import FeedMessage
from kirim.keys import new_token
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
from kirim.preferences import Preferences, TypePolicy, Verdict
from kirim.store import claim_rows, feed, rules
from kirim.store.base import (
    AttemptOutcome,
    Callback,
    CallbackOutcome,
    CallbackResult,
    Claim,
    ClaimKind,
    Finish,
    FinishResult,
    Intent,
    Lease,
    Reaped,
)
from kirim.store.recipients import preferences_from
from kirim.store.rows import Row, attempt_from, delivery_from, evolve, job_from, job_of
from kirim.store.sequence import TIME, At, Group, Now, Operation, Query

LATE = FinishResult(
    committed=False,
    delivery_status=DeliveryStatus.SENT,
    job_status=JobStatus.COMPLETED,
    late_success=True,
)
STALE = FinishResult(committed=False, delivery_status=None, job_status=None)


# -- the rows an operation read, and what it writes back -----------------------------


class Ledger:
    """The rows of one batch's deliveries, as read under the transaction's locks, with
    the changes the operation made to them (written back by ``write``).

    Rows become model values only when a rule looks at them (``delivery``, ``job``,
    ``jobs_of``, ``doubtful``): the common finish needs none (``_finish_plain``).
    """

    def __init__(
        self,
        deliveries: Iterable[Row],
        jobs: Iterable[Row] = (),
        attempts: Iterable[Row] = (),
        *,
        payload: bool = False,
    ) -> None:
        """``payload``: parse the deliveries' payloads (a claim hands them to the worker;
        the other transitions only write state back)."""
        self.payload = payload
        self.rows: dict[int, Row] = {row["id"]: row for row in deliveries}
        self.job_rows: dict[int, Row] = {row["id"]: row for row in jobs}
        self.attempt_rows: dict[int, list[Row]] = {}
        for row in attempts:
            self.attempt_rows.setdefault(row["delivery_id"], []).append(row)
        self.released_at: dict[int, float | None] = {
            i: row["released_at"] for i, row in self.rows.items()
        }
        self._deliveries: dict[int, Delivery] = {}
        self._jobs: dict[int, Job] = {}
        self._attempts: dict[int, list[Attempt]] = {}
        self._changed_deliveries: dict[int, dict[str, Any]] = {}
        self._changed_jobs: dict[int, dict[str, Any]] = {}
        self._changed_attempts: dict[str, dict[str, Any]] = {}
        self._written = False
        #: the statuses as read: every change written is checked against the edge table
        self._was: dict[int, str] = {i: str(row["status"]) for i, row in self.rows.items()}

    # -- reading, as model values ----------------------------------------------------

    def delivery(self, delivery_id: int) -> Delivery | None:
        d = self._deliveries.get(delivery_id)
        if d is None and delivery_id in self.rows:
            d = delivery_from(_present(self.delivery_row(delivery_id)), payload=self.payload)
            self._deliveries[delivery_id] = d
        return d

    def job(self, job_id: int) -> Job | None:
        j = self._jobs.get(job_id)
        if j is None and job_id in self.job_rows:
            j = self._jobs[job_id] = job_from(_present(self.job_row(job_id)))
        return j

    def delivery_row(self, delivery_id: int) -> Row | None:
        """The delivery's columns as this operation left them (its row as read, with
        the values ``set_rows`` wrote over it)."""
        return _over(self.rows.get(delivery_id), self._changed_deliveries.get(delivery_id))

    def job_row(self, job_id: int) -> Row | None:
        """The job's columns as this operation left them (``delivery_row``)."""
        return _over(self.job_rows.get(job_id), self._changed_jobs.get(job_id))

    def jobs_of(self, delivery_id: int) -> list[Job]:
        ids = sorted(i for i, r in self.job_rows.items() if r["delivery_id"] == delivery_id)
        return [j for j in map(self.job, ids) if j is not None]

    def attempts(self, delivery_id: int) -> list[Attempt]:
        found = self._attempts.get(delivery_id)
        if found is None:
            rows = self.attempt_rows.get(delivery_id, ())
            found = self._attempts[delivery_id] = [attempt_from(r) for r in rows]
        return found

    def doubtful(self, delivery_id: int) -> list[Attempt]:
        return rules.doubtful(self.attempts(delivery_id), self.released_at.get(delivery_id))

    def success(self, delivery_id: int) -> Attempt | None:
        return rules.first_success(self.attempts(delivery_id))

    # -- changing ----------------------------------------------------------------------

    def set_delivery(self, d: Delivery) -> None:
        self._deliveries[d.id] = d
        self._changed_deliveries[d.id] = _delivery_values(d, self.released_at[d.id])

    def set_job(self, j: Job) -> None:
        self._jobs[j.id] = j
        self._changed_jobs[j.id] = _job_values(j)

    def set_rows(
        self,
        delivery_id: int,
        delivery: dict[str, Any],
        job_id: int | None = None,
        job: dict[str, Any] | None = None,
    ) -> None:
        """Write column values straight over the rows, no row copied nor model value
        made (``_finish_plain``): ``delivery``, every column of ``_DELIVERY_COLUMNS`` but
        ``id`` and ``released_at``; ``job``, every one of ``_JOB_COLUMNS`` but ``id``."""
        self._deliveries.pop(delivery_id, None)
        delivery["id"] = delivery_id
        delivery["released_at"] = self.released_at[delivery_id]
        self._changed_deliveries[delivery_id] = delivery
        if job_id is not None and job is not None:
            self._jobs.pop(job_id, None)
            job["id"] = job_id
            self._changed_jobs[job_id] = job

    def complete(self, delivery_id: int, outcome: AttemptOutcome) -> None:
        """Record a request's outcome: a fact, whatever the claim's fate; an outcome
        already settled (not requested, not unknown) never changes."""
        attempts = self.attempts(delivery_id)
        for i, a in enumerate(attempts):
            if a.provider_request_id != outcome.provider_request_id:
                continue
            if a.status not in (AttemptStatus.REQUESTED, AttemptStatus.UNKNOWN):
                return
            attempts[i] = evolve(
                a,
                status=outcome.status,
                provider_message_id=rules.first_of(
                    outcome.provider_message_id, a.provider_message_id
                ),
                error=outcome.error,
                completed_at=outcome.completed_at,
            )
            self._changed_attempts[a.provider_request_id] = _attempt_values(attempts[i])
            return

    def complete_row(self, delivery_id: int, outcome: AttemptOutcome) -> None:
        """``complete`` on the attempt rows as read, with no model value made: the
        same change and the same write (``_finish_plain``). An attempt already read as
        a model value goes through ``complete``, so that both stay the same."""
        if delivery_id in self._attempts:
            self.complete(delivery_id, outcome)
            return
        rows = self.attempt_rows.get(delivery_id, [])
        for i, row in enumerate(rows):
            if row["provider_request_id"] != outcome.provider_request_id:
                continue
            if row["status"] not in _OPEN:
                return
            message_id = rules.first_of(outcome.provider_message_id, row["provider_message_id"])
            values = _outcome_values(delivery_id, outcome, message_id)
            rows[i] = {
                **row,
                "status": values["status"],
                "provider_message_id": values["message_id"],
                "error": values["error"],
                "completed_at": values["completed_at"],
            }
            self._changed_attempts[outcome.provider_request_id] = values
            return

    def writes(self, *more: Query) -> Group:
        """The statements that write back every changed row (one per table), and
        ``more`` after them, sent together. Once per operation: until then the rows
        as read are the rows the database holds (``Query.read``)."""
        if self._written:
            raise RuntimeError("a ledger is written back once per operation")
        self._written = True
        steps = []
        for i, values in self._changed_deliveries.items():
            machine.check(i, self._was[i], str(values["status"]), "store.transitions")
        if self._changed_attempts:
            items = list(self._changed_attempts.values())
            steps.append(Query("write_attempts", {"items": items}, count=True))
        if self._changed_deliveries:
            order = sorted(self._changed_deliveries)
            items = [self._changed_deliveries[i] for i in order]
            # over the rows as read: SQLite sets only the columns that changed. A job's
            # write stays whole: each changes its status, which four of the job's five
            # indexes name, and fewer columns measured no faster (docs/benchmarks.md).
            read = [self.rows.get(i) for i in order]
            steps.append(Query("write_deliveries", {"items": items}, count=True, read=read))
        if self._changed_jobs:
            items = [self._changed_jobs[i] for i in sorted(self._changed_jobs)]
            steps.append(Query("write_jobs", {"items": items}, count=True))
        if ids := self._message_ids():
            items = [{"delivery_id": d, "message_id": m} for d, m in sorted(ids)]
            steps.append(Query("write_message_ids", {"items": items}, count=True))
        return (*steps, *more)

    def _message_ids(self) -> set[tuple[int, str]]:
        """The (delivery, provider message id) pairs the changed rows hold: written to
        the side table callbacks find deliveries by (once each: a pair it has already
        is skipped there)."""
        found = {
            (int(v["delivery_id"]), v["message_id"])
            for v in self._changed_attempts.values()
            if v["message_id"] is not None
        }
        found.update(
            (i, v["provider_message_id"])
            for i, v in self._changed_deliveries.items()
            if v["provider_message_id"] is not None
        )
        return found


#: an attempt's statuses that its outcome may still settle (``complete``)
_OPEN = frozenset({str(AttemptStatus.REQUESTED), str(AttemptStatus.UNKNOWN)})

_DELIVERY_COLUMNS = (
    "id",
    "status",
    "doubt",
    "claim_token",
    "claimed_by",
    "claim_expires_at",
    "provider_message_id",
    "last_error",
    "sent_at",
    "released_at",
    "reason",
    "updated_at",
)
_JOB_COLUMNS = (
    "id",
    "status",
    "run_at",
    "attempts",
    "lease_owner",
    "lease_token",
    "lease_expires_at",
    "last_error",
    "updated_at",
)


V = TypeVar("V")


def _over(row: Row | None, written: dict[str, Any] | None) -> Row | None:
    """``row`` with the values ``written`` over it (a copy only when some were)."""
    if row is None or written is None:
        return row
    return {**row, **written}


def _present(value: V | None) -> V:
    """A row the transaction locked cannot vanish before it ends."""
    if value is None:
        raise LookupError("a row vanished inside its transaction")
    return value


def _delivery_values(d: Delivery, released_at: float | None) -> dict[str, Any]:
    values = {c: getattr(d, c) for c in _DELIVERY_COLUMNS if c != "released_at"}
    values["status"] = str(d.status)
    values["doubt"] = None if d.doubt is None else str(d.doubt)
    values["released_at"] = released_at
    return values


def _job_values(j: Job) -> dict[str, Any]:
    values = {c: getattr(j, c) for c in _JOB_COLUMNS}
    values["status"] = str(j.status)
    return values


def _outcome_values(
    delivery_id: int, outcome: AttemptOutcome, message_id: str | None
) -> dict[str, Any]:
    """One item of ``write_attempts``: ``outcome`` of a request of ``delivery_id``, with
    the message id to keep (the outcome's, or one the attempt had)."""
    return {
        "request_id": outcome.provider_request_id,
        "delivery_id": delivery_id,
        "status": str(outcome.status),
        "message_id": message_id,
        "error": outcome.error,
        "completed_at": outcome.completed_at,
    }


def _attempt_values(a: Attempt) -> dict[str, Any]:
    return {
        "request_id": a.provider_request_id,
        "delivery_id": a.delivery_id,
        "status": str(a.status),
        "message_id": a.provider_message_id,
        "error": a.error,
        "completed_at": a.completed_at,
    }


def _read(ids: Sequence[int], job_ids: Sequence[int] = ()) -> Operation[Ledger]:
    """Lock and read the jobs and deliveries of ``ids`` (and the jobs ``job_ids``), then
    read their attempts (a later statement: it sees the intents committed by the
    transactions the locks waited for). The transaction plans by index from here on
    (PostgreSQL's ``plan_by_index``): what it reads and writes, it names by key."""
    _, jobs, deliveries, attempts = yield (
        Query("plan_by_index", optional=True),
        Query("lock_jobs", {"delivery_ids": list(ids), "job_ids": list(job_ids)}),
        Query("lock_deliveries", {"ids": list(ids)}),
        Query("attempts_of_deliveries", {"ids": list(ids)}),
    )
    return Ledger(deliveries, jobs, attempts)


# -- claim (docs/design.md, steps 1–3) ----------------------------------------------


def claim(
    worker_id: str,
    given: float,
    lease: float,
    limit: int | None,
    policies: Mapping[str, TypePolicy] | None = None,
) -> Operation[list[Claim]]:
    """Lease up to ``limit`` due jobs (None: every one) and claim their deliveries.

    A delivery already final completes its job (noop); one that another worker holds
    puts the job back without counting it (busy); one whose earlier attempt succeeded
    is marked sent (noop). A delivery whose type is in ``policies`` is checked against
    its recipient's preferences as they are now (``rules.preference_check``): it is
    suppressed (noop, ``Claim.suppressed``), or deferred to its send window (its job
    back in the queue without counting the claim; not returned). A claim reports the
    earlier attempts that may have reached the provider, and until when one may still
    land.

    The fresh deliveries among the first due jobs (nothing to decide) are claimed
    first, in SQL (``_fresh``); the rest of the limit is claimed here, the due jobs it
    passed over first.
    """
    fresh = [] if limit is None else (yield from _fresh(worker_id, given, lease, limit, policies))
    if limit is not None and len(fresh) == limit:
        return fresh
    at = yield TIME
    now = at(given)
    until = now + lease
    left = None if limit is None else limit - len(fresh)
    # (PostgreSQL: the transaction plans by index alone from its first statement on, see
    # its plan_by_index; _fresh's group, when it ran, began with it)
    planned = () if limit is not None else (Query("plan_by_index", optional=True),)
    *_, due = yield (*planned, Query("due_jobs", {"now": now, "limit": left}))
    if not due:
        return fresh
    # PostgreSQL returns the rows in delivery order (its lock order): claim in due order.
    rows = sorted(due, key=lambda r: (r["job_run_at"], r["job_id"]))
    ledger = Ledger(rows, payload=True)
    current_of = {r["id"]: ledger.delivery(r["id"]) for r in rows}
    kinds = {r["job_id"]: rules.claim_kind(_present(current_of[r["id"]]), now) for r in rows}
    ours = sorted({r["id"] for r in rows if kinds[r["job_id"]] is ClaimKind.CLAIMED})
    prior: dict[int, int] = {}
    prefs: dict[str, Preferences] = {}
    if ours:
        asked = rules.recipients_to_check(map(current_of.__getitem__, ours), policies)
        read = (Query("preferences_of", {"ids": asked}),) if asked else ()
        history, *found = yield (Query("claim_history", {"ids": ours}), *read)
        for a in history:
            prior[a["claimed_id"]] = int(a["prior_requests"])
            if a["id"] is not None:
                ledger.attempt_rows.setdefault(a["delivery_id"], []).append(a)
        prefs = {r["recipient_id"]: preferences_from(r) for r in (found[0] if found else ())}
    claims = []
    for row in rows:
        token = new_token()
        current = _present(current_of[row["id"]])
        kind = kinds[row["job_id"]]
        leased = claim_rows.leased_job(row, worker_id, token, until, now)
        if kind is ClaimKind.BUSY:
            retry_at = current.claim_expires_at if current.claim_expires_at is not None else now
            ledger.set_job(
                rules.unleased(
                    _job(row), status=JobStatus.RETRY_SCHEDULED, run_at=retry_at, updated_at=now
                )
            )
            reason = f"delivery claimed by {current.claimed_by}"
            claims.append(_claim(ClaimKind.BUSY, leased, current, token, now, reason=reason))
            continue
        if kind is ClaimKind.NOOP:
            reason = f"delivery already {current.status}"
            ledger.set_job(rules.unleased(leased, status=JobStatus.COMPLETED, last_error=reason))
            claims.append(_claim(ClaimKind.NOOP, leased, current, token, now, reason=reason))
            continue
        # a delivery without earlier attempts has no success, doubt nor history to read
        earlier = current.id in ledger.attempt_rows
        success = ledger.success(current.id) if earlier else None
        if success is not None:
            reason = "an earlier attempt succeeded"
            done = rules.sent_late(current, success.provider_message_id, now)
            ledger.set_delivery(done)
            ledger.set_job(rules.unleased(leased, status=JobStatus.COMPLETED, last_error=reason))
            claims.append(_claim(ClaimKind.NOOP, leased, done, token, now, reason=reason))
            continue
        verdict = rules.preference_check(current, policies, prefs, now) if policies else None
        # A deferral is always safe; a suppression is, unless an earlier request may
        # have arrived: then the delivery is claimed ``withheld``, and its doubt is
        # settled without sending (suppressing it would claim it was never sent).
        withheld = None
        if verdict is not None:
            if verdict.action == "defer" or not ledger.doubtful(current.id):
                stopped = _stopped(ledger, current, _job(row), verdict, token, now)
                if stopped is not None:
                    claims.append(stopped)
                continue
            withheld = str(verdict.reason)
        delivery = claim_rows.processing(current, worker_id, token, until, now)
        ledger.set_rows(
            delivery.id,
            claim_rows.processing_columns(row, worker_id, token, until, now),
            leased.id,
            claim_rows.leased_job_columns(leased),
        )
        found = tuple(ledger.doubtful(delivery.id)) if earlier else ()
        claims.append(
            Claim(
                kind=ClaimKind.CLAIMED,
                job=leased,
                delivery=delivery,
                token=token,
                doubtful=found,
                prior_requests=prior.get(delivery.id, 0),
                now=now,
                unsettled_until=rules.unsettled_until(found, now),
                history=_since_release(ledger, delivery.id) if earlier else (),
                withheld=withheld,
            )
        )
    yield ledger.writes()
    if fresh:  # the jobs claim_fresh passed over may have been due before its claims
        return sorted(fresh + claims, key=lambda c: (c.job.run_at, c.job.id))
    return claims


def _fresh(
    worker_id: str,
    given: float,
    lease: float,
    limit: int,
    policies: Mapping[str, TypePolicy] | None,
) -> Operation[list[Claim]]:
    """The claim of the fresh deliveries among the first ``limit`` due jobs: pending,
    no attempt, of no type in ``policies``. ``claim`` would claim each (no earlier
    request, history, success nor preference to read: nothing to decide), and the
    dialect's ``claim_fresh`` writes what it would (``claim_rows``) with no row read
    into Python first: PostgreSQL's in one statement (the jobs leased in it too), and
    SQLite's in two (the deliveries, then their jobs: ``claim_fresh_jobs``)."""
    now = yield Now(given)
    args = {
        "now": now,
        "limit": limit,
        "lease": lease,
        "worker_id": worker_id,
        "checked_types": sorted(policies or ()),
    }
    _, rows = yield (Query("plan_by_index", optional=True), Query("claim_fresh", args))
    jobs: dict[int, Job] = {}
    if rows and "job_id" not in rows[0]:  # the deliveries alone (SQLite: a table a statement)
        ids = [r["id"] for r in rows]
        lease_args = {"now": now, "lease": lease, "worker_id": worker_id, "ids": ids}
        leased = yield Query("claim_fresh_jobs", lease_args)
        jobs = {j["delivery_id"]: job_from(j) for j in leased}
        if len(jobs) != len(rows):  # each claimed delivery has its one due job
            raise StoreError(f"claim_fresh: {len(rows)} deliveries claimed, {len(jobs)} jobs")
    claims = []
    for row in rows:
        machine.check(row["id"], "pending", "processing", "store.transitions")
        claims.append(
            Claim(
                kind=ClaimKind.CLAIMED,
                job=jobs.get(row["id"]) or job_from(row, "job_"),
                delivery=delivery_from(row),
                token=row["claim_token"],
                now=float(row["updated_at"]),
            )
        )
    return sorted(claims, key=lambda c: (c.job.run_at, c.job.id))


def _job(row: Row) -> Job:
    """The due row's job as read (a claim that does not lease it puts it back)."""
    job = job_of(row)
    assert job is not None
    return job


def _since_release(ledger: Ledger, delivery_id: int) -> tuple[Attempt, ...]:
    """The delivery's attempts since its last release (a claim's ``history``)."""
    attempts = ledger.attempts(delivery_id)
    return tuple(rules.since_release(attempts, ledger.released_at[delivery_id]))


def _stopped(
    ledger: Ledger, d: Delivery, job: Job, verdict: Verdict, token: str, now: float
) -> Claim | None:
    """The claim-time check said no: the delivery suppressed (a NOOP claim, its job
    completed), or deferred to its send window (None: not returned; its job back in the
    queue at the opening, in the status it had, the claim not counted)."""
    if verdict.action == "defer" or verdict.reason is None:
        ledger.set_delivery(rules.unclaimed(d, updated_at=now))
        ledger.set_job(rules.unleased(job, run_at=verdict.until, updated_at=now))
        return None
    note = f"suppressed: {verdict.reason}"
    done = rules.suppressed(d, verdict.reason, now)
    closed = rules.unleased(job, status=JobStatus.COMPLETED, last_error=note, updated_at=now)
    ledger.set_delivery(done)
    ledger.set_job(closed)
    return Claim(
        kind=ClaimKind.NOOP,
        job=closed,
        delivery=done,
        token=token,
        reason=note,
        now=now,
        suppressed=str(verdict.reason),
    )


def _claim(
    kind: ClaimKind, job: Job, delivery: Delivery, token: str, now: float, *, reason: str
) -> Claim:
    return Claim(kind=kind, job=job, delivery=delivery, token=token, reason=reason, now=now)


# -- intents and heartbeats (docs/design.md, step 5): fenced in one statement --


def record_intents(intents: Sequence[Intent]) -> Operation[list[bool]]:
    """Insert attempt rows where the claim token still holds (in delivery id order, the
    lock order of every backend); one answer per intent, in the given order. One
    statement where every claim holds (PostgreSQL runs it on its own: one round trip;
    its ``requested_at`` None where the statement reads the database's clock)."""
    if not intents:
        return []
    first = yield Now(intents[0].requested_at)
    at = None if first is None else (yield TIME)
    items = [
        {
            "delivery_id": it.delivery_id,
            "job_id": it.job_id,
            "token": it.token,
            "number": it.number,
            "request_id": it.provider_request_id,
            "worker_id": it.worker_id,
            "requested_at": None if at is None else at(it.requested_at),
            "send_deadline": it.send_deadline,
            "settles_at": it.settles_at,
            "provider": it.provider,
        }
        for it in sorted(intents, key=lambda it: it.delivery_id)
    ]
    count = yield Query("insert_intents", {"items": items}, count=True)
    if count == len(items):  # every claim held: the common case
        return [True] * len(intents)
    request_ids = [it["request_id"] for it in items]
    written = yield Query("intents_written", {"request_ids": request_ids})
    ids = {r["provider_request_id"] for r in written}
    return [it.provider_request_id in ids for it in intents]


def not_found(
    delivery_id: int, request_ids: Sequence[str], given: float, error: str | None = None
) -> Operation[None]:
    """The delivery's provider, asked once these requests had settled (the worker's
    in-doubt lookup), has none of them: each is recorded as not processed, as an
    operator's reconcile records it, where it is still open (requested or unknown: one
    settled never changes). Its own transaction, before the worker sends again: the
    answer is kept whatever becomes of the claim, and no later claim reads these
    requests as in doubt (explorer seed 21462: a refusal of the resend was held in
    doubt, and its fallback never tried). The delivery and its jobs are not written.
    ``error``: what is recorded (None: the lookup's answer; ``rules.UNWRITTEN``:
    requests of an in-commit channel whose commit never came)."""
    at = yield TIME
    now = at(given)
    if error is None:
        error = "not processed: the provider, asked once it had settled, has no such request"
    items = [
        _outcome_values(
            delivery_id,
            AttemptOutcome(
                provider_request_id=request_id,
                status=AttemptStatus.FAILED_TRANSIENT,
                provider_message_id=None,
                error=error,
                completed_at=now,
            ),
            None,
        )
        for request_id in request_ids
    ]
    yield (Query("write_attempts", {"items": items}, count=True),)


def heartbeat(leases: Sequence[Lease], given: float, lease: float) -> Operation[list[bool]]:
    """Extend job leases and delivery claims; False where the lease token was lost."""
    if not leases:
        return []
    at = yield TIME
    now = at(given)
    items = [
        {"job_id": it.job_id, "delivery_id": it.delivery_id, "token": it.token} for it in leases
    ]
    args = {"items": items, "until": now + lease, "now": now}
    held, _ = yield (Query("extend_leases", args), Query("extend_claims", args, count=True))
    kept = {(r["id"], r["lease_token"]) for r in held}
    return [(it.job_id, it.token) in kept for it in leases]


# -- finish (docs/design.md, step 6) --------------------------------------------------


def finish(items: Sequence[Finish]) -> Operation[list[FinishResult]]:
    """Outcomes, delivery statuses and job states of many claims, fenced by their tokens.

    Items are decided in order, each on the rows as the ones before it left them (a
    delivery may appear twice). Two rules keep a status from claiming more than kirim
    knows: a success recorded by any attempt outranks a failure, and a doubt decision
    (assume sent, hold) whose doubt vanished before its commit (every earlier request
    was answered with a definite failure meanwhile) is replaced by a retry. A stale
    token rejects the transition, but a late answer is still a fact: a success marks
    the delivery sent, a definite failure of the only doubtful request withdraws an
    assumption (``reopen``).
    """
    if not items:
        return []
    ids = sorted({it.delivery_id for it in items})
    ledger = yield from _read(ids, sorted({it.job_id for it in items}))
    at = yield TIME  # after the locks: the time at which the decisions are taken
    once = _once(items)
    out = []
    for it in items:
        now = at(it.now)
        plain = it.delivery_id in once and rules.plain(it)
        result = _finish_plain(ledger, it, now) if plain else None
        out.append(result or _finish_one(ledger, it, now))
    messages = _feed_messages(items, out)
    if not messages:
        yield ledger.writes()
        return out
    # An inbox delivery's message is written in the commit that marks it sent (once per
    # recipient and key): no request leaves, so it is never in doubt.
    *_, written, _ = yield ledger.writes(*feed.insert_rows(messages, at(items[0].now)))
    written_ids = {(r["recipient_id"], r["idempotency_key"]): int(r["id"]) for r in written}
    for i, it in enumerate(items):
        m = it.feed
        item_id = None if m is None else written_ids.pop((m.recipient_id, m.idempotency_key), None)
        if item_id is not None:
            out[i] = replace(out[i], feed_item=item_id)
    return out


class FenceRaced(Exception):
    """A fenced finish wrote a job whose delivery then failed its fence in the same
    statement (changed meanwhile by a writer that did not wait for the job's lock; none
    does today: docs/design.md, "Lock order"): the statement aborted itself, nothing was
    written; the batch goes the careful way (``finish``)."""


def fenceable(it: Finish) -> bool:
    """A finish the one fenced statement may write (``finish_fenced``): sent by its own
    success (or with no request), failed, or scheduled again, with no doubt decision,
    no refund and no feed message. What the careful way would still check (the claim's
    token on the delivery and the job, a success of another attempt outranking a
    failure) is the statement's fence; any other finish goes the careful way."""
    if it.doubt is not None or it.refund_attempt or it.feed is not None:
        return False
    if it.delivery_status is DeliveryStatus.SENT:
        return rules.plain(it)
    return it.delivery_status in (DeliveryStatus.FAILED, DeliveryStatus.PENDING) and (
        it.attempt is None or it.attempt.status is not AttemptStatus.SUCCEEDED
    )


def finish_fenced(items: Sequence[Finish]) -> Operation[list[FinishResult | None]]:
    """``finish`` of the fenceable items (``fenceable``; each delivery once in the
    batch) in one statement that writes each only where its claim's token still holds
    on its job and its delivery, with no lock taken before (PostgreSQL's
    ``finish_fenced``, run on its own: one round trip). None for an item it did not
    write (not fenceable, or its fence failed): ``finish`` decides it, the careful way,
    in a transaction of its own.

    The statement writes what ``_finish_plain`` writes for a claim that holds
    (``rules.committed_columns``, ``rules.job_committed_columns``)."""
    chosen = _fenceable(items)
    out: list[FinishResult | None] = [None] * len(items)
    if not chosen:
        return out
    first = yield Now(chosen[0].now)
    at = None if first is None else (yield TIME)
    rows = yield Query("finish_fenced", {"items": [_fenced(it, at) for it in chosen]})
    done = {int(r["delivery_id"]) for r in rows}
    for i, it in enumerate(items):
        if it.delivery_id in done:  # each delivery is once among those chosen
            out[i] = _fenced_result(it)
    return out


def finish_fenced_first(items: Sequence[Finish]) -> Operation[list[FinishResult]]:
    """``finish`` in one transaction, SQLite's: the fenceable items (``fenceable``;
    each delivery once in the batch) by fenced statements with no row read into Python
    first (``finish_fenced_jobs``, ``_deliveries``, ``_attempts``: one run per item,
    each written only where its claim's token still holds on its job and its delivery,
    and ``finish_fenced_message_ids``), then the rest the careful way. The fenced
    statements write all of their items or the transaction is undone: the transaction
    holds the database's write lock, so when one writes fewer rows than it was given (a
    claim lost, an outcome already settled, a success that outranks a failure), this
    raises ``FenceRaced``, the transaction is rolled back, and the caller finishes the
    batch the careful way. They write what ``_finish_plain`` writes for a claim that
    holds (``rules.committed_columns``, ``rules.job_committed_columns``)."""
    chosen = _fenceable(items)
    at = yield TIME
    args = [_fenced(it, at) for it in chosen]
    requests = [a for a in args if a["request_id"] is not None]
    if args:
        jobs, deliveries = yield (
            Query("finish_fenced_jobs", {"items": args}, count=True),
            Query("finish_fenced_deliveries", {"items": args}, count=True),
        )
        attempts = (
            (yield Query("finish_fenced_attempts", {"items": requests}, count=True))
            if requests
            else 0
        )
        if (jobs, deliveries, attempts) != (len(args), len(args), len(requests)):
            raise FenceRaced(
                f"finish_fenced: {len(args)} items, {len(requests)} requests: "
                f"{jobs} jobs, {deliveries} deliveries, {attempts} attempts written"
            )
        ids = {
            "ids": [a["delivery_id"] for a in args],
            "request_ids": [a["request_id"] for a in requests],
        }
        yield Query("finish_fenced_message_ids", ids, count=True)
    done = {it.delivery_id for it in chosen}
    fenced = [_fenced_result(it) if it.delivery_id in done else None for it in items]
    rest = [it for it, result in zip(items, fenced, strict=True) if result is None]
    careful = (yield from finish(rest)) if rest else []
    return merged(fenced, careful)


def merged(
    fenced: Sequence[FinishResult | None], careful: Sequence[FinishResult]
) -> list[FinishResult]:
    """The results of a batch: ``fenced``'s, and ``careful``'s in order where it has None."""
    rest = iter(careful)
    return [done if done is not None else next(rest) for done in fenced]


def _fenceable(items: Sequence[Finish]) -> list[Finish]:
    """The items the fenced statements may write (each delivery once in the batch), in
    job id order: the order PostgreSQL's plans update them in (lock order)."""
    once = _once(items)
    chosen = [it for it in items if it.delivery_id in once and fenceable(it)]
    return sorted(chosen, key=lambda it: it.job_id)


def _fenced_result(it: Finish) -> FinishResult:
    """What a fenced statement wrote for ``it``, its fence having held on a delivery
    processing under the claim (the edge written)."""
    machine.check(it.delivery_id, "processing", str(it.delivery_status), "store.transitions")
    return FinishResult(
        committed=True,
        delivery_status=it.delivery_status,
        job_status=it.job_status,
        doubt=None,
        error=it.error,
    )


def _fenced(it: Finish, at: At | None) -> dict[str, Any]:
    """One item of ``finish_fenced``: its fence, its outcome and what it writes (``now``
    None: the statement reads the database's clock, ``kirim_now``)."""
    outcome = it.attempt
    return {
        "delivery_id": it.delivery_id,
        "job_id": it.job_id,
        "token": it.token,
        "now": None if at is None else at(it.now),
        "request_id": None if outcome is None else outcome.provider_request_id,
        "outcome": None if outcome is None else str(outcome.status),
        "outcome_message_id": None if outcome is None else outcome.provider_message_id,
        "outcome_error": None if outcome is None else outcome.error,
        "completed_at": None if outcome is None else outcome.completed_at,
        "status": str(it.delivery_status),
        "message_id": it.provider_message_id,
        "error": it.error,
        "reason": it.reason,
        "job_status": str(it.job_status),
        "run_at": it.run_at,
        "delay": it.delay,
    }


def _feed_messages(items: Sequence[Finish], results: Sequence[FinishResult]) -> list[FeedMessage]:
    """The feed messages of the finishes that left their delivery sent, one per key."""
    found: dict[tuple[str, str], FeedMessage] = {}
    for it, result in zip(items, results, strict=True):
        if it.feed is not None and result.delivery_status is DeliveryStatus.SENT:
            found.setdefault((it.feed.recipient_id, it.feed.idempotency_key), it.feed)
    return list(found.values())


def _once(items: Sequence[Finish]) -> set[int]:
    """The deliveries that appear once in the batch."""
    seen: set[int] = set()
    twice: set[int] = set()
    for it in items:
        (twice if it.delivery_id in seen else seen).add(it.delivery_id)
    return seen - twice


def _finish_plain(ledger: Ledger, it: Finish, now: float) -> FinishResult | None:
    """``_finish_one`` for a plain finish (``rules.plain``) whose claim holds, on the
    rows as read: no other row can change its outcome, so no model value is needed.
    None: not that case (the claim was lost: ``_finish_one`` decides)."""
    row = ledger.delivery_row(it.delivery_id)
    if row is None or row["claim_token"] is None or row["claim_token"] != it.token:
        return None
    w = rules.Written.of(it, now)
    if it.attempt is not None:
        ledger.complete_row(it.delivery_id, it.attempt)
    delivery = rules.committed_row(row, w, now)
    job_row = ledger.job_row(it.job_id)
    job = None
    if job_row is not None and job_row["lease_token"] == it.token:
        job = rules.job_committed_row(job_row, w, now)
    ledger.set_rows(it.delivery_id, delivery, it.job_id, job)
    return FinishResult(
        committed=True,
        delivery_status=w.status,
        job_status=w.job_status,
        doubt=w.doubt,
        error=w.error,
    )


def _finish_one(ledger: Ledger, it: Finish, now: float) -> FinishResult:
    d = ledger.delivery(it.delivery_id)
    holds = d is not None and d.claim_token is not None and d.claim_token == it.token
    if it.feed is not None and not holds:
        it = _unwritten(it)
    if it.attempt is not None:
        ledger.complete(it.delivery_id, it.attempt)
    if d is None:
        return STALE
    w = rules.Written.of(it, now)
    if w.status is not DeliveryStatus.SENT:
        success = ledger.success(d.id)
        if success is not None:
            w = w.outranked_by(success.provider_message_id)
    if w.may_have_lost_its_doubt(it) and not ledger.doubtful(d.id) and ledger.success(d.id) is None:
        w = w.without_doubt(it, now, ledger.job(it.job_id))
    if holds:
        ledger.set_delivery(rules.committed(d, w, now))
        job = ledger.job(it.job_id)
        if job is not None and job.lease_token == it.token:
            ledger.set_job(rules.job_committed(job, w, now))
        return FinishResult(
            committed=True,
            delivery_status=w.status,
            job_status=w.job_status,
            doubt=w.doubt,
            error=w.error,
        )
    # Stale token: the transition is rejected, but a success is a fact worth keeping.
    if it.attempt is not None and it.attempt.status is AttemptStatus.SUCCEEDED:
        ledger.set_delivery(rules.sent_late(d, it.attempt.provider_message_id, now))
        for job in ledger.jobs_of(d.id):
            if job.status in rules.CARRYING:
                ledger.set_job(
                    rules.unleased(
                        job,
                        status=JobStatus.COMPLETED,
                        last_error="completed by a late success",
                        updated_at=now,
                    )
                )
        return LATE
    if it.attempt is not None and it.attempt.status in rules.DEFINITE_FAILURE:
        reopened = _reopen(ledger, it, d, now)
        if reopened is not None:
            return reopened
    return STALE


def _unwritten(it: Finish) -> Finish:
    """The finish of an in-commit channel's request (the inbox: its message is written
    by this commit, ``Finish.feed``) whose claim no longer holds. The message exists
    only by a commit under a holding claim, so this one writes none, and its success is
    no fact: nothing reached the user by it. Its request is recorded as not written (a
    definite failure: an assumption that it was sent is withdrawn, ``_reopen``). A stale
    commit can come after its attempt settled (a process paused past the settle
    margin), when prune may have taken the message another claim wrote: it wrote the
    message a second time (explorer seed 50928)."""
    attempt = it.attempt
    if attempt is not None and attempt.status is AttemptStatus.SUCCEEDED:
        attempt = replace(
            attempt,
            status=AttemptStatus.FAILED_TRANSIENT,
            provider_message_id=None,
            error=rules.UNWRITTEN,
        )
    return replace(it, attempt=attempt, feed=None)


def _reopen(ledger: Ledger, it: Finish, d: Delivery, now: float) -> FinishResult | None:
    """A late definite failure of the only doubtful request withdraws an assumption.

    The delivery was marked sent (assumed) or held because that request might have
    arrived; it was refused, so the user has nothing. Its latest job is scheduled
    again, within its attempts, and the worker routes it from the attempts
    (``rules.withdrawn``): a permanent refusal moves it on to a fallback, or fails it
    when every channel of its chain refused it for good.
    """
    if not machine.reopens(d) or ledger.doubtful(d.id) or ledger.success(d.id):
        return None
    assert it.attempt is not None
    jobs = ledger.jobs_of(d.id)
    job = jobs[-1] if jobs else None
    status, job_status = rules.withdrawn(it.attempt, job)
    error = f"late answer: {it.attempt.error}"
    ledger.set_delivery(
        rules.unclaimed(
            d,
            status=status,
            doubt=Doubt.RESOLVED,
            last_error=error,
            sent_at=None,
            provider_message_id=None,
            updated_at=now,
        )
    )
    if job is not None and job.status in (JobStatus.COMPLETED, JobStatus.DEAD):
        ledger.set_job(
            rules.unleased(
                job,
                status=job_status,
                run_at=now + (it.delay or 0.0),
                last_error=error,
                updated_at=now,
            )
        )
    return FinishResult(
        committed=False, delivery_status=status, job_status=job_status, reopened=True
    )


# -- reap and release ------------------------------------------------------------------


def reap(given: float, in_commit: Collection[str] = ()) -> Operation[list[Reaped]]:
    """Jobs whose lease expired go back to the queue (their claims revoked: the holder's
    token stops working), or die on their final attempt (their deliveries parked in
    doubt if a request may have left, else failed). ``in_commit``: channels whose
    effect is written in the finish's own commit (the inbox): an attempt of theirs
    whose outcome never committed had no effect, so it is no doubt."""
    at = yield TIME
    now = at(given)
    expired = yield Query("expired_jobs", {"now": now})
    if not expired:
        return []
    ids = sorted({r["delivery_id"] for r in expired})
    # Locking the deliveries waits for intents in flight; their attempts are read after.
    deliveries, attempts = yield (
        Query("lock_deliveries", {"ids": ids}),
        Query("attempts_of_deliveries", {"ids": ids}),
    )
    ledger = Ledger(deliveries, expired, attempts)
    out = []
    requeued = False
    for row in expired:
        job = _present(ledger.job(row["id"]))
        dead = job.attempts >= job.max_attempts
        d = ledger.delivery(job.delivery_id)
        holds = (
            d is not None
            and d.status is DeliveryStatus.PROCESSING
            and d.claim_token == job.lease_token
        )
        if dead:
            error = "lease expired on the final attempt"
            ledger.set_job(
                rules.unleased(job, status=JobStatus.DEAD, last_error=error, updated_at=now)
            )
            if d is not None and holds:
                doubt = rules.may_have_arrived(ledger.doubtful(d.id), d.channel, in_commit)
                ledger.set_delivery(rules.parked(d, bool(doubt), now))
        else:
            requeued = True
            ledger.set_job(
                rules.unleased(
                    job,
                    status=JobStatus.QUEUED,
                    run_at=now,
                    last_error="lease expired",
                    updated_at=now,
                )
            )
            if d is not None and holds:
                ledger.set_delivery(rules.revoked(d, now))
        out.append(
            Reaped(
                job_id=job.id,
                delivery_id=job.delivery_id,
                attempt=job.attempts,
                owner=job.lease_owner,
                dead=dead,
                channel=row["channel"] or "",
            )
        )
    wake = (Query("notify", optional=True),) if requeued else ()
    yield ledger.writes(*wake)
    return out


def release(leases: Sequence[Lease], given: float) -> Operation[None]:
    """Give back leases at shutdown: jobs return to the queue now (the claim still
    counts as an attempt), and claims are revoked so the next claimer takes over."""
    if not leases:
        return None
    at = yield TIME
    now = at(given)
    ids = sorted({it.delivery_id for it in leases})
    jobs, deliveries = yield (
        Query("lock_jobs", {"delivery_ids": ids, "job_ids": [it.job_id for it in leases]}),
        Query("lock_deliveries", {"ids": ids}),
    )
    ledger = Ledger(deliveries, jobs)
    requeued = False
    for it in leases:
        job = ledger.job(it.job_id)
        if job is not None and job.status is JobStatus.RUNNING and job.lease_token == it.token:
            requeued = True
            ledger.set_job(
                rules.unleased(
                    job,
                    status=JobStatus.QUEUED,
                    run_at=now,
                    last_error="released at shutdown",
                    updated_at=now,
                )
            )
        d = ledger.delivery(it.delivery_id)
        if d is not None and d.status is DeliveryStatus.PROCESSING and d.claim_token == it.token:
            ledger.set_delivery(rules.revoked(d, now))
    wake = (Query("notify", optional=True),) if requeued else ()
    yield ledger.writes(*wake)
    return None


# -- the operator's verbs ----------------------------------------------------------------


def _settled(ledger: Ledger, delivery_id: int, now: float, action: str) -> None:
    """Raise ``NotSettled`` while an earlier request of the delivery may still land."""
    until = rules.unsettled_until(ledger.doubtful(delivery_id), now)
    if until is not None:
        raise NotSettled(delivery_id, until, action)


def retry_dead(delivery_id: int, given: float, release: bool = True) -> Operation[bool]:
    """An operator sends a dead-lettered delivery again, releasing any earlier doubt
    (``release`` False: keeping it, so that the worker asks the provider first: the
    in-doubt policy of a channel that can be asked).

    Not while an earlier request may still land (``NotSettled``): the operator's
    judgement that the user has nothing holds only once nothing more can arrive.
    """
    ledger = yield from _read([delivery_id])
    at = yield TIME  # after the locks
    now = at(given)
    _settled(ledger, delivery_id, now, "retry")
    d = ledger.delivery(delivery_id)
    jobs = ledger.jobs_of(delivery_id)
    if d is None or not machine.can_retry(d, jobs):
        return False
    if release or not ledger.doubtful(delivery_id):
        ledger.released_at[delivery_id] = now  # the doubt of the requests before is released
    ledger.set_delivery(
        rules.unclaimed(
            d, status=DeliveryStatus.PENDING, doubt=None, last_error=None, updated_at=now
        )
    )
    for job in jobs:
        if job.status is JobStatus.DEAD:
            ledger.set_job(
                evolve(
                    job,
                    status=JobStatus.COMPLETED,
                    last_error="retried by operator",
                    updated_at=now,
                )
            )
    fresh = {"delivery_id": delivery_id, "run_at": now, "max_attempts": jobs[-1].max_attempts}
    yield ledger.writes(
        Query("insert_jobs", {"items": [fresh], "now": now}, count=True),
        Query("notify", optional=True),
    )
    return True


def cancel(delivery_id: int, given: float) -> Operation[bool]:
    """Cancel a delivery that is neither in flight nor sent.

    Not while an earlier request may still land (``NotSettled``): "canceled" must
    mean that nothing reaches the user. A request that may have arrived before keeps
    the delivery in doubt: canceled, but perhaps received (``canceled (held)``).
    """
    ledger = yield from _read([delivery_id])
    at = yield TIME  # after the locks
    now = at(given)
    _settled(ledger, delivery_id, now, "cancel")
    d = ledger.delivery(delivery_id)
    if d is None or not machine.can_cancel(d):
        return False
    doubt = rules.first_of(d.doubt, Doubt.HELD) if ledger.doubtful(delivery_id) else d.doubt
    ledger.set_delivery(evolve(d, status=DeliveryStatus.CANCELED, doubt=doubt, updated_at=now))
    for job in ledger.jobs_of(delivery_id):
        if job.status in (JobStatus.QUEUED, JobStatus.RETRY_SCHEDULED, JobStatus.DEAD):
            ledger.set_job(
                rules.unleased(
                    job, status=JobStatus.COMPLETED, last_error="canceled", updated_at=now
                )
            )
    yield ledger.writes()
    return True


def reconcile(
    delivery_id: int, given: float, found: bool, message_id: str | None, seen: int
) -> Operation[bool]:
    """Settle a delivery's doubt with what its provider answered (``found``): the
    operator's ``reconcile``. ``seen``: how many attempts the delivery had when the
    provider was asked; False (nothing written) when it has more now, is claimed, or
    has no doubt left (a worker or another operator moved it on meanwhile).

    Found: the user has it: ``sent`` (or the provider's word, delivered or bounced, is
    kept), doubt ``resolved``, its jobs completed. Not found, every earlier request
    settled (``NotSettled`` otherwise): those requests are recorded as not processed,
    and the delivery is certain: a held or assumed one goes back to the worker while
    its last job has attempts left (``rules.withdrawn``: the worker routes it from the
    attempts, a fallback after a refusal for good), else ``failed`` (a dead letter an
    operator may retry without any risk of a second copy); a canceled one ``canceled``.
    """
    ledger = yield from _read([delivery_id])
    at = yield TIME
    now = at(given)
    _settled(ledger, delivery_id, now, "reconcile")
    d = ledger.delivery(delivery_id)
    doubtful = ledger.doubtful(delivery_id)
    if d is None or len(ledger.attempts(delivery_id)) != seen:
        return False
    if d.claim_token is not None or not doubtful:
        return False
    jobs = ledger.jobs_of(delivery_id)
    if found:
        if d.status in CONFIRMED_DELIVERY:
            done = evolve(d, doubt=Doubt.RESOLVED, updated_at=now)
        else:
            done = rules.sent_late(d, message_id, now)
            done = evolve(done, doubt=Doubt.RESOLVED, last_error="reconciled: the provider has it")
        ledger.set_delivery(done)
        for job in jobs:
            if job.status in rules.CARRYING:
                ledger.set_job(
                    rules.unleased(
                        job, status=JobStatus.COMPLETED, last_error="reconciled", updated_at=now
                    )
                )
        yield ledger.writes()
        return True
    for a in doubtful:
        ledger.complete(
            delivery_id,
            AttemptOutcome(
                provider_request_id=a.provider_request_id,
                status=AttemptStatus.FAILED_TRANSIENT,
                provider_message_id=None,
                error="reconciled: the provider has no such request",
                completed_at=now,
            ),
        )
    last = jobs[-1] if jobs else None
    if d.status is not DeliveryStatus.CANCELED:
        # the doubt was all that stopped its route: it goes on as a withdrawn assumption
        # does (a fallback after a refusal for good, else its channel again) while its
        # job has attempts left (explorer seed 21462: a held refusal, failed with its
        # fallback never tried)
        status, job_status = rules.withdrawn(None, last)
        if job_status is JobStatus.RETRY_SCHEDULED and last is not None:
            ledger.set_delivery(
                rules.unclaimed(
                    d,
                    status=status,
                    doubt=None,
                    sent_at=None,
                    last_error="reconciled: the provider has no request of it; sending on",
                    updated_at=now,
                )
            )
            ledger.set_job(
                rules.unleased(
                    last,
                    status=job_status,
                    run_at=now,
                    last_error="reconciled: not sent, attempts left",
                    updated_at=now,
                )
            )
            yield ledger.writes()
            return True
    status = (
        DeliveryStatus.CANCELED if d.status is DeliveryStatus.CANCELED else (DeliveryStatus.FAILED)
    )
    ledger.set_delivery(
        rules.unclaimed(
            d,
            status=status,
            doubt=Doubt.RESOLVED,
            sent_at=None,
            last_error="reconciled: the provider has no request of it",
            updated_at=now,
        )
    )
    for job in jobs:
        if job.status in (JobStatus.QUEUED, JobStatus.RETRY_SCHEDULED, JobStatus.COMPLETED):
            dead = status is DeliveryStatus.FAILED and job is jobs[-1]
            ledger.set_job(
                rules.unleased(
                    job,
                    status=JobStatus.DEAD if dead else JobStatus.COMPLETED,
                    last_error="reconciled: not sent",
                    updated_at=now,
                )
            )
    yield ledger.writes()
    return True


# -- delivery callbacks ------------------------------------------------------------------

UNKNOWN = CallbackResult(outcome=CallbackOutcome.UNKNOWN)
KEPT = CallbackResult(outcome=CallbackOutcome.UNKNOWN, kept=True)
#: seconds a callback no delivery has recorded is kept for (``apply_kept``)
KEEP_CALLBACKS = 86_400.0


def confirm(cb: Callback, *, keep: bool = True) -> Operation[CallbackResult]:
    """A provider's callback about one of its messages (``rules.confirmed``).

    The delivery is found by the message id (or the callback's idempotency key), locked
    with its jobs, and its confirmed message ids read after the lock: a concurrent
    callback for it has committed, so a second message id is counted once. A callback
    said before (the same message id and word) changes nothing; one that ends the
    delivery completes its jobs (a dead letter too) and revokes any claim. Nothing here
    can make kirim send: no job is ever scheduled.

    A callback for a message no delivery has recorded yet (an instant bounce can
    overtake the provider's answer to the request) is kept (``kirim_callback_inbox``,
    unless ``keep`` is False) and applied when its message id or key is recorded
    (``apply_kept``): its answer says ``unknown``, ``kept``.
    """
    found = yield Query(
        "callback_find", {"channel": cb.channel, "message_id": cb.message_id, "key": cb.key}
    )
    if not found:
        if not keep:
            return UNKNOWN
        at = yield TIME
        yield Query("keep_callback", {**_callback_args(cb), "now": at(cb.now)}, count=True)
        return KEPT
    return (yield from _confirm_one(int(found[0]["id"]), cb))


def _callback_args(cb: Callback) -> dict[str, Any]:
    return {
        "channel": cb.channel,
        "message_id": cb.message_id,
        "status": str(cb.status),
        "key": cb.key,
        "reason": cb.reason,
        "reported_at": cb.reported_at,
    }


def _confirm_one(delivery_id: int, cb: Callback) -> Operation[CallbackResult]:
    ledger = yield from _read([delivery_id])
    at = yield TIME  # after the locks
    now = at(cb.now)
    d = ledger.delivery(delivery_id)
    if d is None:  # pruned meanwhile
        return UNKNOWN
    rows = yield Query("confirmations_of", {"ids": [delivery_id]})
    known = {r["message_id"]: r for r in rows}
    ids = [r["message_id"] for r in rows]
    before = known.get(cb.message_id)
    if before is not None and (
        before["status"] == cb.status or not rules.newer_word(before["reported_at"], cb.reported_at)
    ):
        return CallbackResult(
            outcome=CallbackOutcome.REPEATED,
            delivery_id=d.id,
            status=d.status,
            previous=d.status,
            message_ids=tuple(ids),
        )
    delivered = {m for m, r in known.items() if r["status"] == CallbackStatus.DELIVERED}
    delivered.discard(cb.message_id)
    duplicate = cb.status is CallbackStatus.DELIVERED and bool(delivered)
    if before is None:
        ids.append(cb.message_id)
    others = rules.other_copies(d, ledger.attempts(d.id), known, cb.message_id)
    after = rules.confirmed(d, cb, ids, now, others=others, duplicate=duplicate)
    ledger.set_delivery(after)
    if after.status in CONFIRMED_DELIVERY:
        for job in ledger.jobs_of(d.id):
            if job.status in rules.CARRYING:
                ledger.set_job(
                    rules.unleased(
                        job,
                        status=JobStatus.COMPLETED,
                        last_error=f"ended by the provider's callback ({cb.status})",
                        updated_at=now,
                    )
                )
    yield ledger.writes(
        Query(
            "write_confirmation",
            {
                "delivery_id": d.id,
                "message_id": cb.message_id,
                "status": str(cb.status),
                "reason": cb.reason,
                "reported_at": cb.reported_at,
                "now": now,
            },
            count=True,
        )
    )
    changed = after.status is not d.status
    return CallbackResult(
        outcome=CallbackOutcome.APPLIED if changed else CallbackOutcome.RECORDED,
        delivery_id=d.id,
        status=after.status,
        previous=d.status,
        resolved=rules.settled_doubt(d) if after.status in CONFIRMED_DELIVERY else None,
        duplicate=duplicate,
        message_ids=tuple(ids),
    )


def apply_kept(given: float, limit: int | None = 100) -> Operation[list[CallbackResult]]:
    """Apply the kept callbacks whose delivery is recorded now (each in this one
    transaction, oldest first), forget those kept longer than ``KEEP_CALLBACKS``; the
    results of those applied."""
    at = yield TIME
    now = at(given)
    kept = yield Query("kept_callbacks", {"limit": limit})
    out: list[CallbackResult] = []
    done: list[int] = []
    for row in kept:
        cb = Callback(
            channel=row["channel"],
            message_id=row["message_id"],
            status=CallbackStatus(row["status"]),
            key=row["key"],
            reason=row["reason"],
            reported_at=row["reported_at"],
            now=given,
        )
        found = yield Query(
            "callback_find", {"channel": cb.channel, "message_id": cb.message_id, "key": cb.key}
        )
        if found:
            out.append((yield from _confirm_one(int(found[0]["id"]), cb)))
            done.append(int(row["id"]))
        elif float(row["received_at"]) < now - KEEP_CALLBACKS:
            done.append(int(row["id"]))
    if done:
        yield Query("forget_kept_callbacks", {"ids": done}, count=True)
    return out


__all__ = [
    "KEEP_CALLBACKS",
    "LATE",
    "STALE",
    "FenceRaced",
    "Ledger",
    "apply_kept",
    "cancel",
    "claim",
    "confirm",
    "fenceable",
    "finish",
    "finish_fenced",
    "finish_fenced_first",
    "heartbeat",
    "merged",
    "reap",
    "reconcile",
    "record_intents",
    "release",
    "retry_dead",
]
