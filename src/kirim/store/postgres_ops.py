"""The PostgreSQL backend's transactions, over one cursor that the caller opened.

The hot paths are set-based: one statement per batch (claim adds a second one that
reads the attempts after the claim's locks, in a fresh snapshot). What is rare
(two outcomes for one delivery in a batch, a success recorded under a failed
status) follows ``logic.finish`` item by item, with the same named queries.
Rows are locked jobs first, then deliveries, as in every query of ``queries.sql``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from psycopg import AsyncCursor
from psycopg.rows import DictRow

from kirim.errors import NotSettled, StoreError
from kirim.model import (
    AttemptStatus,
    Delivery,
    DeliveryStatus,
    Doubt,
    EnqueueResult,
    Job,
    JobStatus,
)
from kirim.store.base import (
    Claim,
    ClaimKind,
    Finish,
    FinishResult,
    NewDelivery,
    Reaped,
    RequestBegin,
    RequestedDelivery,
    RequestSlot,
    RequestState,
    Respond,
    StoredResponse,
)
from kirim.store.logic import (
    DEFINITE_FAILURE,
    Row,
    Written,
    _must,
    attempt_from,
    delivery_from,
    job_from,
    request_slot_from,
    unsettled_until,
    withdrawable,
    withdrawn,
)
from kirim.store.sqlfiles import load_queries

Q = load_queries("postgres")
Cursor = AsyncCursor[DictRow]
_SENT = (DeliveryStatus.SENT,)


async def rows(
    cur: Cursor, name: str, args: Mapping[str, Any] | None = None, *, prepare: bool | None = None
) -> list[DictRow]:
    await cur.execute(Q[name], args, prepare=prepare)
    return await cur.fetchall()


async def one(cur: Cursor, name: str, args: Mapping[str, Any] | None = None) -> DictRow | None:
    await cur.execute(Q[name], args)
    return await cur.fetchone()


async def run(cur: Cursor, name: str, args: Mapping[str, Any]) -> int:
    await cur.execute(Q[name], args)
    return cur.rowcount


def job_of(row: Row) -> Job | None:
    """The ``job_*`` columns of a joined row."""
    if row["job_id"] is None:
        return None
    return job_from({key[4:]: value for key, value in row.items() if key.startswith("job_")})


# -- enqueue ------------------------------------------------------------------------


async def enqueue(
    cur: Cursor, items: Sequence[NewDelivery], now: float | None
) -> list[EnqueueResult]:
    """Insert deliveries and jobs; a known key returns the existing row (``created=False``).

    Not prepared: a generic plan would not know how many items the arrays hold (the
    caller's own connection, in ``enqueue_in``, is not set to plan every time).
    """
    if not items:
        return []
    first: dict[str, NewDelivery] = {}
    for it in items:
        first.setdefault(it.idempotency_key, it)
    inserted = await rows(
        cur,
        "enqueue",
        {
            "keys": [it.idempotency_key for it in items],
            "event_ids": [it.event_id for it in items],
            "recipients": [it.recipient for it in items],
            "channels": [it.channel for it in items],
            "payloads": [it.payload_json for it in items],
            "hashes": [it.payload_hash for it in items],
            "run_ats": [None if it.run_at is None else float(it.run_at) for it in items],
            "max_attempts": [it.max_attempts for it in items],
            "now": now,
        },
        prepare=False,
    )
    created: dict[str, tuple[Delivery, Job]] = {}
    for row, job_id in zip(inserted, inserted[0]["job_ids"] if inserted else [], strict=True):
        it = first[row["idempotency_key"]]
        job = Job(
            id=job_id,
            delivery_id=row["id"],
            status=JobStatus.QUEUED,
            run_at=float(row["created_at"] if it.run_at is None else it.run_at),
            attempts=0,
            max_attempts=it.max_attempts,
            lease_owner=None,
            lease_token=None,
            lease_expires_at=None,
            last_error=None,
            created_at=float(row["created_at"]),
            updated_at=float(row["created_at"]),
        )
        created[row["idempotency_key"]] = (delivery_from(row), job)
    missing = sorted(first.keys() - created.keys())
    existing: dict[str, EnqueueResult] = {}
    if missing:
        for r in await rows(cur, "deliveries_by_keys", {"keys": missing}):
            existing[r["idempotency_key"]] = EnqueueResult(
                delivery=delivery_from(r), job=job_of(r), created=False
            )
    out = []
    for it in items:
        key = it.idempotency_key
        if key in created:  # the first item with a new key created it; the others find it
            delivery, job = created[key]
            out.append(EnqueueResult(delivery=delivery, job=job, created=it is first[key]))
        elif key in existing:
            out.append(existing[key])
        else:
            raise StoreError(f"delivery with key {key!r} vanished during enqueue")
    return out


# -- claim --------------------------------------------------------------------------


async def claim(
    cur: Cursor, worker_id: str, now: float | None, lease: float, limit: int | None
) -> list[Claim]:
    """Lease due jobs and claim their deliveries (DESIGN steps 1–3), as ``logic.claim``.

    ``now``: the caller's time of record, or None for the database's clock.
    """
    leased = await rows(
        cur,
        "claim",
        {"now": now, "lease": float(lease), "limit": limit, "worker_id": worker_id},
    )
    if not leased:
        return []
    now = float(leased[0]["db_now"])
    until = now + lease
    ours = [r["id"] for r in leased if r["kind"] == "claimed"]
    if leased[0]["leased"] != len(leased) or leased[0]["claimed"] != len(ours):
        raise StoreError("a claimed row changed under its lock")  # pragma: no cover
    history = await rows(cur, "claim_history", {"ids": ours}) if ours else []
    succeeded: dict[int, DictRow] = {}
    doubtful: dict[int, list[DictRow]] = {}
    prior: dict[int, int] = {}
    for a in history:
        prior[a["claimed_id"]] = int(a["prior_requests"])
        if a["id"] is None:  # no attempt of interest: only the count
            continue
        if a["status"] == AttemptStatus.SUCCEEDED:
            succeeded.setdefault(a["delivery_id"], a)
        else:
            doubtful.setdefault(a["delivery_id"], []).append(a)
    claims = []
    for row in leased:
        job = job_of(row)
        assert job is not None
        token = row["job_lease_token"]
        current = delivery_from(row)
        if row["kind"] == "noop":
            reason = f"delivery already {current.status}"
            claims.append(
                Claim(
                    kind=ClaimKind.NOOP,
                    job=job,
                    delivery=current,
                    token=token,
                    reason=reason,
                    now=now,
                )
            )
            continue
        if row["kind"] == "busy":
            claims.append(
                Claim(
                    kind=ClaimKind.BUSY,
                    job=job,
                    delivery=current,
                    token=token,
                    reason=f"delivery claimed by {current.claimed_by}",
                    now=now,
                )
            )
            continue
        delivery = replace(
            current,
            status=DeliveryStatus.PROCESSING,
            claim_token=token,
            claimed_by=worker_id,
            claim_expires_at=until,
            updated_at=now,
        )
        success = succeeded.get(delivery.id)
        if success is not None:
            claims.append(await _noop_after_success(cur, job, delivery.id, token, success, now))
            continue
        found = tuple(attempt_from(a) for a in doubtful.get(delivery.id, ()))
        claims.append(
            Claim(
                kind=ClaimKind.CLAIMED,
                job=job,
                delivery=delivery,
                token=token,
                doubtful=found,
                prior_requests=prior.get(delivery.id, 0),
                now=now,
                unsettled_until=unsettled_until(found, now),
            )
        )
    return claims


async def _noop_after_success(
    cur: Cursor, job: Job, delivery_id: int, token: str, success: Row, now: float
) -> Claim:
    """An earlier attempt succeeded: the delivery is sent, the claim is a no-op."""
    reason = "an earlier attempt succeeded"
    done = await one(
        cur,
        "late_success_delivery",
        {"message_id": success["provider_message_id"], "now": now, "delivery_id": delivery_id},
    )
    assert done is not None
    await run(
        cur,
        "finish_job",
        {
            "status": "completed",
            "run_at": None,
            "delay": None,
            "refund": 0,
            "error": reason,
            "now": now,
            "job_id": job.id,
            "token": token,
        },
    )
    return Claim(
        kind=ClaimKind.NOOP,
        job=job,
        delivery=delivery_from(done),
        token=token,
        reason=reason,
        now=now,
    )


# -- finish -------------------------------------------------------------------------


def needs_items(items: Sequence[Finish]) -> bool:
    """Whether a batch must follow ``logic.finish`` item by item (rare shapes: one
    delivery twice, a success under a failed status, a doubt decision whose premise is
    re-checked, a definite failure that may withdraw an assumption when stale)."""
    ids = [it.delivery_id for it in items]
    return len(set(ids)) != len(ids) or any(
        (
            it.attempt is not None
            and it.attempt.status is AttemptStatus.SUCCEEDED
            and it.delivery_status not in _SENT
        )
        or it.doubt in (Doubt.ASSUMED_SENT, Doubt.HELD)
        or (it.attempt is not None and it.attempt.status in DEFINITE_FAILURE)
        for it in items
    )


async def finish_batch(
    cur: Cursor, items: Sequence[Finish], nows: Sequence[float | None]
) -> list[FinishResult]:
    """One statement for the batch (distinct deliveries), same results as ``logic.finish``.

    ``nows``: each item's time of record (None: the database's clock).
    """

    def col(fn: Any) -> list[Any]:
        return [fn(it) for it in items]

    found = await rows(
        cur,
        "finish",
        {
            "delivery_ids": col(lambda it: it.delivery_id),
            "job_ids": col(lambda it: it.job_id),
            "tokens": col(lambda it: it.token),
            "nows": list(nows),
            "request_ids": col(lambda it: it.attempt and it.attempt.provider_request_id),
            "attempt_statuses": col(lambda it: it.attempt and str(it.attempt.status)),
            "attempt_message_ids": col(lambda it: it.attempt and it.attempt.provider_message_id),
            "attempt_errors": col(lambda it: it.attempt and it.attempt.error),
            "completed_ats": col(lambda it: it.attempt and float(it.attempt.completed_at)),
            "statuses": col(lambda it: str(it.delivery_status)),
            "doubts": col(lambda it: None if it.doubt is None else str(it.doubt)),
            "message_ids": col(lambda it: it.provider_message_id),
            "errors": col(lambda it: it.error),
            "job_statuses": col(lambda it: str(it.job_status)),
            "run_ats": col(lambda it: None if it.run_at is None else float(it.run_at)),
            "delays": col(lambda it: None if it.delay is None else float(it.delay)),
            "refunds": col(lambda it: 1 if it.refund_attempt else 0),
        },
    )
    out = []
    for it, row in zip(items, found, strict=True):
        if row["committed"]:
            out.append(
                FinishResult(
                    committed=True,
                    delivery_status=DeliveryStatus(row["f_status"]),
                    job_status=JobStatus(row["f_job_status"]),
                )
            )
        elif it.attempt is not None and it.attempt.status is AttemptStatus.SUCCEEDED:
            out.append(_LATE)
        else:
            out.append(_STALE)
    return out


_LATE = FinishResult(
    committed=False,
    delivery_status=DeliveryStatus.SENT,
    job_status=JobStatus.COMPLETED,
    late_success=True,
)
_STALE = FinishResult(committed=False, delivery_status=None, job_status=None)


async def finish_one(cur: Cursor, it: Finish, now: float | None) -> FinishResult:
    """``logic.finish`` for one item, jobs locked before the delivery (same rules: a
    success outranks a failure, a doubt decision whose premise vanished is replaced, a
    late definite failure may withdraw an assumption)."""
    await rows(cur, "lock_job", {"job_id": it.job_id, "delivery_id": it.delivery_id})
    t = float((await one(cur, "store_now", {"now": now}) or {"now": it.now})["now"])
    if it.attempt is not None:
        a = it.attempt
        await run(
            cur,
            "complete_attempt",
            {
                "status": str(a.status),
                "message_id": a.provider_message_id,
                "error": a.error,
                "completed_at": float(a.completed_at),
                "request_id": a.provider_request_id,
            },
        )
    w = Written.of(it, t)
    key = {"delivery_id": it.delivery_id}
    if w.status not in _SENT:
        success = await one(cur, "succeeded_attempt", key)
        if success is not None:
            w = w.outranked_by(success["provider_message_id"])
    if (
        w.may_have_lost_its_doubt(it)
        and not await rows(cur, "doubtful_attempts", key)
        and await one(cur, "succeeded_attempt", key) is None
    ):
        w = w.without_doubt(it, t)
    changed = await run(
        cur,
        "finish_delivery",
        {
            "status": str(w.status),
            "doubt": None if w.doubt is None else str(w.doubt),
            "message_id": w.message_id,
            "error": w.error,
            "now": t,
            "delivery_id": it.delivery_id,
            "token": it.token,
        },
    )
    if changed == 1:
        await run(
            cur,
            "finish_job",
            {
                "status": str(w.job_status),
                "run_at": w.run_at,
                "delay": None,
                "refund": int(w.refund),
                "error": w.error,
                "now": t,
                "job_id": it.job_id,
                "token": it.token,
            },
        )
        return FinishResult(committed=True, delivery_status=w.status, job_status=w.job_status)
    # Stale token: the transition is rejected, but a success is a fact worth keeping.
    if it.attempt is not None and it.attempt.status is AttemptStatus.SUCCEEDED:
        args = {"message_id": it.attempt.provider_message_id, "now": t}
        await one(cur, "late_success_delivery", {**args, "delivery_id": it.delivery_id})
        await run(cur, "late_success_jobs", {"now": t, "delivery_id": it.delivery_id})
        return _LATE
    if it.attempt is not None and it.attempt.status in DEFINITE_FAILURE:
        reopened = await reopen(cur, it, t)
        if reopened is not None:
            return reopened
    return _STALE


async def reopen(cur: Cursor, it: Finish, now: float) -> FinishResult | None:
    """``logic.reopen``: a late definite failure of the only doubtful request."""
    key = {"delivery_id": it.delivery_id}
    row = await one(cur, "delivery_by_id", {"id": it.delivery_id})
    if row is None:
        return None
    d = delivery_from(row)
    if not withdrawable(d) or await rows(cur, "doubtful_attempts", key):
        return None
    if await one(cur, "succeeded_attempt", key) is not None:
        return None
    assert it.attempt is not None
    job_row = await one(cur, "latest_job", key)
    job = None if job_row is None else job_from(job_row)
    status, job_status = withdrawn(it.attempt, job)
    error = f"late answer: {it.attempt.error}"
    args = {"status": str(status), "error": error, "now": now}
    await run(cur, "reopen_delivery", {**args, "delivery_id": d.id})
    if job is not None:
        await run(
            cur,
            "reopen_job",
            {**args, "status": str(job_status), "delay": it.delay or 0.0, "job_id": job.id},
        )
    return FinishResult(
        committed=False, delivery_status=status, job_status=job_status, reopened=True
    )


# -- reap, operator actions -----------------------------------------------------------


async def reap(cur: Cursor, now: float | None) -> list[Reaped]:
    """Expired leases back to the queue; on the final attempt, dead (as ``logic.reap``)."""
    expired = await rows(cur, "reap", {"now": now})
    dead = [r for r in expired if r["dead"]]
    if dead:
        ids = [r["delivery_id"] for r in dead]
        await rows(cur, "lock_deliveries", {"ids": ids})  # wait for intents in flight
        tokens = [r["lease_token"] for r in dead]
        await run(cur, "park_expired_deliveries", {"now": now, "ids": ids, "tokens": tokens})
    if len(dead) < len(expired):
        await rows(cur, "notify")
    return [
        Reaped(
            job_id=r["id"],
            delivery_id=r["delivery_id"],
            attempt=r["attempts"],
            owner=r["lease_owner"],
            dead=r["dead"],
            channel=r["channel"] or "",
        )
        for r in expired
    ]


async def must_be_settled(cur: Cursor, delivery_id: int, now: float | None, action: str) -> None:
    """``logic.must_be_settled``: NotSettled while an earlier request may still land."""
    await rows(cur, "lock_deliveries", {"ids": [delivery_id]})  # intents in flight first
    t = float(_must(await one(cur, "store_now", {"now": now}))["now"])
    found = await rows(cur, "doubtful_attempts", {"delivery_id": delivery_id})
    until = unsettled_until([attempt_from(a) for a in found], t)
    if until is not None:
        raise NotSettled(delivery_id, until, action)


async def retry_dead(cur: Cursor, delivery_id: int, now: float | None) -> bool:
    """``logic.retry_dead``: an operator sends a dead-lettered delivery again."""
    args = {"delivery_id": delivery_id, "now": now}
    await rows(cur, "lock_delivery_jobs", args)
    await must_be_settled(cur, delivery_id, now, "retry")
    if await run(cur, "revive_delivery", args) != 1:
        return False
    await run(cur, "bury_dead_jobs", args)
    await one(cur, "insert_job_for_retry", args)
    await rows(cur, "notify")
    return True


async def cancel(cur: Cursor, delivery_id: int, now: float | None) -> bool:
    """``logic.cancel``: cancel a delivery that is neither in flight nor sent."""
    args = {"delivery_id": delivery_id, "now": now}
    await rows(cur, "lock_delivery_jobs", args)
    await must_be_settled(cur, delivery_id, now, "cancel")
    if await run(cur, "cancel_delivery", args) != 1:
        return False
    await run(cur, "cancel_jobs", args)
    return True


# -- the HTTP service's idempotent requests ------------------------------------------


async def begin_requests(
    cur: Cursor, items: Sequence[RequestBegin], now: float | None, hold: float
) -> list[RequestSlot]:
    """The second half of ``Store.handle_requests``: take the keys, or say who has them.

    Keys are taken in key order, in every transaction, so that two servers taking the
    same keys wait for each other (an insert waits for the uncommitted row of another)
    without a deadlock.
    """
    slots: dict[int, RequestSlot] = {}
    for i in sorted(range(len(items)), key=lambda i: items[i].idempotency_key):
        it = items[i]
        args = {
            "key": it.idempotency_key,
            "fingerprint": it.fingerprint,
            "token": it.lock_token,
            "hold": float(hold),
            "now": now,
        }
        for _ in range(3):  # a row released between two statements: take the key again
            row = await one(cur, "insert_request", args)
            if row is None:
                row = await one(cur, "take_over_request", args)
            if row is not None:
                slots[i] = RequestSlot(state=RequestState.ACQUIRED, fingerprint=it.fingerprint)
                break
            held = await one(cur, "request_by_key", args)
            if held is not None:
                slots[i] = request_slot_from(held)
                break
        else:
            raise StoreError(f"the request row of key {it.idempotency_key!r} keeps vanishing")
    return [slots[i] for i in range(len(items))]


async def enqueue_requests(
    cur: Cursor, items: Sequence[RequestedDelivery], now: float | None, respond: Respond
) -> list[tuple[EnqueueResult, StoredResponse | None]]:
    """The first half of ``Store.handle_requests``: record the deliveries (in key order)
    and complete, or release, the requests' rows."""
    order = sorted(range(len(items)), key=lambda i: items[i].delivery.idempotency_key)
    found = await enqueue(cur, [items[i].delivery for i in order], now)
    results: dict[int, EnqueueResult] = dict(zip(order, found, strict=True))
    out: list[tuple[EnqueueResult, StoredResponse | None]] = []
    done: dict[str, list[Any]] = {
        "keys": [],
        "tokens": [],
        "codes": [],
        "responses": [],
        "delivery_ids": [],
    }
    released: dict[str, list[str]] = {"keys": [], "tokens": []}
    for i, it in enumerate(items):
        result = results[i]
        kept = respond(result)
        key = it.delivery.idempotency_key
        if kept is None:
            released["keys"].append(key)
            released["tokens"].append(it.lock_token)
        else:
            done["keys"].append(key)
            done["tokens"].append(it.lock_token)
            done["codes"].append(kept.status_code)
            done["responses"].append(kept.body)
            done["delivery_ids"].append(result.delivery.id)
        out.append((result, kept))
    if done["keys"]:
        await run(cur, "complete_requests", {**done, "now": now})
    if released["keys"]:
        await run(cur, "release_requests", released)
    return out
