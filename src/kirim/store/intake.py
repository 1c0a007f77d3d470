"""What comes in, written once for both drivers: enqueue (deliveries and their jobs,
once per idempotency key; digests and throttles by ``kirim.store.admission``) and the
HTTP service's idempotent requests.

Each function is an ``Operation`` (``kirim.store.sequence``) run in the caller's
transaction. The batch is one statement for the deliveries (``insert_deliveries``);
a dialect that inserts their jobs in the same statement (PostgreSQL's one CTE)
returns each row's ``job_id``, another (SQLite) leaves it NULL and gets a second
statement (``insert_jobs_of``). Keys known before are read in one statement, the
tombstones of pruned ones in another.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from kirim.errors import StoreError
from kirim.model import Delivery, DeliveryStatus, EnqueueResult, Job, JobStatus
from kirim.store import admission
from kirim.store.base import (
    NewDelivery,
    RequestBegin,
    RequestedDelivery,
    RequestSlot,
    RequestState,
    Respond,
    StoredResponse,
)
from kirim.store.retention import delivery_from_tombstone, key_hash
from kirim.store.rows import delivery_from, job_of, request_slot_from
from kirim.store.sequence import Now, Operation, Query

# -- enqueue ------------------------------------------------------------------------


def enqueue(items: Sequence[NewDelivery], given: float) -> Operation[list[EnqueueResult]]:
    """Insert deliveries and jobs; a known key returns the existing row (``created=False``),
    a pruned one whose tombstone is kept the delivery rebuilt from it (``pruned=True``).
    Events for digests and throttles: ``kirim.store.admission``, in the same transaction.
    """
    if not items:
        return []
    admission.refuse_unstorable(items)
    inserted = yield from _insert(items, given)
    if not admission.needed(items):
        return [r for r in inserted if r is not None]
    return (yield from admission.admit(items, inserted, given))


def _insert(items: Sequence[NewDelivery], given: float) -> Operation[list[EnqueueResult | None]]:
    """The plain items' results (``admission.plain``; None for the others)."""
    first: dict[str, NewDelivery] = {}
    for it in items:
        if admission.plain(it):
            first.setdefault(it.idempotency_key, it)
    if not first:
        return [None] * len(items)
    now = yield Now(given)
    rows = yield Query(
        "insert_deliveries", {"items": [_row(it) for it in first.values()], "now": now}
    )
    made = {r["idempotency_key"]: r for r in rows}
    job_ids = {r["id"]: r["job_id"] for r in rows}
    if rows and rows[0]["job_id"] is None:  # the jobs in a statement of their own
        wanted = [
            _job_row(first[r["idempotency_key"]], r["id"])
            for r in sorted(rows, key=lambda r: r["id"])
        ]
        jobs = yield Query("insert_jobs_of", {"items": wanted, "now": now})
        job_ids = {r["delivery_id"]: r["id"] for r in jobs}
    created: dict[str, tuple[Delivery, Job]] = {}
    for key, row in made.items():
        at = float(row["created_at"])
        it = first[key]
        created[key] = (_delivery(it, row["id"], at), _job(it, row["id"], job_ids[row["id"]], at))
    existing = yield from _known(sorted(first.keys() - created.keys()))
    out: list[EnqueueResult | None] = []
    for it in items:
        key = it.idempotency_key
        if not admission.plain(it):
            out.append(None)
        elif key in created:  # the first item with a new key created it; the others find it
            delivery, job = created[key]
            out.append(EnqueueResult(delivery=delivery, job=job, created=it is first[key]))
        else:
            out.append(existing[key])
    return out


def _known(keys: list[str]) -> Operation[dict[str, EnqueueResult]]:
    """The keys' deliveries with their latest jobs, or the tombstones they left."""
    existing: dict[str, EnqueueResult] = {}
    if not keys:
        return existing
    for r in (yield Query("deliveries_by_keys", {"keys": keys})):
        existing[r["idempotency_key"]] = EnqueueResult(
            delivery=delivery_from(r), job=job_of(r), created=False
        )
    # Read after the insert: a delivery it saw that a prune deleted since left its
    # tombstone, committed with the deletion.
    by_hash = {key_hash(k): k for k in keys if k not in existing}
    if by_hash:
        for r in (yield Query("tombstones_by_hashes", {"key_hashes": list(by_hash)})):
            key = by_hash[r["key_hash"]]
            existing[key] = EnqueueResult(
                delivery=delivery_from_tombstone(r, key), job=None, created=False, pruned=True
            )
    for key in keys:
        if key not in existing:
            # its tombstone expired between two statements: the key is free, try again
            raise StoreError(f"delivery with key {key!r} vanished during enqueue; try again")
    return existing


def _row(it: NewDelivery) -> dict[str, Any]:
    """An item of ``insert_deliveries``."""
    return {
        "key": it.idempotency_key,
        "event_id": it.event_id,
        "recipient": it.recipient,
        "channel": it.channel,
        "payload": it.payload_json,
        "payload_hash": it.payload_hash,
        "run_at": None if it.run_at is None else float(it.run_at),
        "max_attempts": it.max_attempts,
        "key_hash": key_hash(it.idempotency_key),
        "type": it.type,
        "recipient_id": it.recipient_id,
        "suppressed": it.suppressed,
    }


def _last_error(it: NewDelivery) -> str | None:
    return None if it.suppressed is None else f"suppressed ({it.suppressed})"


def _job_row(it: NewDelivery, delivery_id: int) -> dict[str, Any]:
    """An item of ``insert_jobs_of``: queued, or completed if the delivery is suppressed."""
    return {
        "delivery_id": delivery_id,
        "status": "queued" if it.suppressed is None else "completed",
        "run_at": it.run_at,
        "max_attempts": it.max_attempts,
        "last_error": _last_error(it),
    }


def _delivery(it: NewDelivery, delivery_id: int, now: float) -> Delivery:
    """The delivery row ``insert_deliveries`` wrote for ``it`` (as ``delivery_from``
    would read it back)."""
    return Delivery(
        id=delivery_id,
        idempotency_key=it.idempotency_key,
        event_id=it.event_id,
        recipient=it.recipient,
        channel=it.channel,
        payload=json.loads(it.payload_json) if it.payload is None else it.payload,
        payload_hash=it.payload_hash,
        status=DeliveryStatus.PENDING if it.suppressed is None else DeliveryStatus.SUPPRESSED,
        claim_token=None,
        claimed_by=None,
        claim_expires_at=None,
        provider_message_id=None,
        doubt=None,
        last_error=None,
        created_at=now,
        updated_at=now,
        sent_at=None,
        type=it.type,
        recipient_id=it.recipient_id,
        reason=it.suppressed,
    )


def _job(it: NewDelivery, delivery_id: int, job_id: int, now: float) -> Job:
    """The job row written with the delivery of ``it``."""
    return Job(
        id=job_id,
        delivery_id=delivery_id,
        status=JobStatus.QUEUED if it.suppressed is None else JobStatus.COMPLETED,
        run_at=float(now if it.run_at is None else it.run_at),
        attempts=0,
        max_attempts=it.max_attempts,
        lease_owner=None,
        lease_token=None,
        lease_expires_at=None,
        last_error=_last_error(it),
        created_at=now,
        updated_at=now,
    )


# -- the HTTP service's idempotent requests ------------------------------------------


def handle_requests(
    begin: Sequence[RequestBegin],
    enqueue_items: Sequence[RequestedDelivery],
    given: float,
    hold: float,
    respond: Respond,
) -> Operation[tuple[list[RequestSlot], list[tuple[EnqueueResult, StoredResponse | None]]]]:
    """``Store.handle_requests``: the requests that hold their keys first, then the
    keys the others want."""
    done = (yield from enqueue_requests(enqueue_items, given, respond)) if enqueue_items else []
    slots = (yield from begin_requests(begin, given, hold)) if begin else []
    return slots, done


def begin_requests(
    items: Sequence[RequestBegin], given: float, hold: float
) -> Operation[list[RequestSlot]]:
    """Take each request's idempotency key, or say who holds (or held) it.

    Keys are taken in key order, in every transaction, so that two servers taking the
    same keys wait for each other (an insert waits for the uncommitted row of another)
    without a deadlock.
    """
    now = yield Now(given)
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
            row = yield Query("insert_request", args)
            if not row:
                row = yield Query("take_over_request", args)
            if row:
                slots[i] = RequestSlot(state=RequestState.ACQUIRED, fingerprint=it.fingerprint)
                break
            held = yield Query("request_by_key", args)
            if held:
                slots[i] = request_slot_from(held[0])
                break
        else:
            raise StoreError(f"the request row of key {it.idempotency_key!r} keeps vanishing")
    return [slots[i] for i in range(len(items))]


def enqueue_request(
    items: Sequence[NewDelivery],
    key: str,
    token: str,
    given: float,
    respond: Callable[[Sequence[EnqueueResult]], StoredResponse | None],
    fingerprint: str | None = None,
) -> Operation[list[EnqueueResult]]:
    """``Store.enqueue_request``: the deliveries, then the one request's row."""
    results = yield from enqueue(items, given)
    first = results[0].delivery.id if results else None
    made = fingerprint if any(r.created for r in results) else None
    yield from settle([(key, token, respond(results), first, made)], given)
    return results


def enqueue_requests(
    items: Sequence[RequestedDelivery], given: float, respond: Respond
) -> Operation[list[tuple[EnqueueResult, StoredResponse | None]]]:
    """Record the requests' deliveries (in key order), then complete, or release, the
    requests' rows."""
    order = sorted(range(len(items)), key=lambda i: items[i].delivery.idempotency_key)
    found = yield from enqueue([items[i].delivery for i in order], given)
    results: dict[int, EnqueueResult] = dict(zip(order, found, strict=True))
    out = [(results[i], respond(results[i])) for i in range(len(items))]
    requests = [
        (
            it.delivery.idempotency_key,
            it.lock_token,
            kept,
            result.delivery.id,
            it.fingerprint if result.created else None,
        )
        for it, (result, kept) in zip(items, out, strict=True)
    ]
    yield from settle(requests, given)
    return out


def settle(
    requests: Sequence[tuple[str, str, StoredResponse | None, int | None, str | None]],
    given: float,
) -> Operation[None]:
    """Complete each request's row (key, lock token, response to replay, the delivery
    it names, the fingerprint of a request that created it) while it still holds its
    key (or, having created it, while the key is in progress for the same body), or
    release it (no response): one statement for each."""
    done = [
        {
            "key": key,
            "token": token,
            "status_code": kept.status_code,
            "response": kept.body,
            "delivery_id": delivery_id,
            "fingerprint": made,
        }
        for key, token, kept, delivery_id, made in requests
        if kept is not None
    ]
    released = [{"key": key, "token": token} for key, token, kept, _, _ in requests if kept is None]
    now = yield Now(given)
    if done:
        yield Query("complete_requests", {"items": done, "now": now}, count=True)
    if released:
        yield Query("release_requests", {"items": released}, count=True)
