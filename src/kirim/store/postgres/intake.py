"""PostgreSQL: what comes in. Enqueue (deliveries and their jobs, once per idempotency
key, one statement per batch; digests and throttles by ``kirim.store.admission``) and
the HTTP service's idempotent requests, over one cursor that the caller opened."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kirim.errors import StoreError
from kirim.model import Delivery, EnqueueResult, Job, JobStatus
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
from kirim.store.postgres.driver import Cursor, drive, one, rows, run
from kirim.store.retention import delivery_from_tombstone, key_hash
from kirim.store.rows import delivery_from, job_of, request_slot_from

# -- enqueue ------------------------------------------------------------------------


async def enqueue(
    cur: Cursor, items: Sequence[NewDelivery], now: float | None
) -> list[EnqueueResult]:
    """Insert deliveries and jobs; a known key returns the existing row (``created=False``),
    a pruned one whose tombstone is kept the delivery rebuilt from it (``pruned=True``).
    Events for digests and throttles: ``kirim.store.admission``, in the same
    transaction (``now`` None: the database's clock, read once for it).
    """
    if not items:
        return []
    admission.refuse_unstorable(items)
    plain = [it for it in items if admission.plain(it)]
    found = iter(await _insert(cur, plain, now))
    inserted = [next(found) if admission.plain(it) else None for it in items]
    if not admission.needed(items):
        return [r for r in inserted if r is not None]
    op = admission.admit(items, inserted, 0.0 if now is None else now)
    return await drive(op, cur, "database" if now is None else None)


async def _insert(
    cur: Cursor, items: Sequence[NewDelivery], now: float | None
) -> list[EnqueueResult]:
    """The plain items' deliveries and jobs, one statement.

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
            "key_hashes": [key_hash(it.idempotency_key) for it in items],
            "types": [it.type for it in items],
            "recipient_ids": [it.recipient_id for it in items],
            "suppressed": [it.suppressed for it in items],
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
            status=JobStatus.QUEUED if it.suppressed is None else JobStatus.COMPLETED,
            run_at=float(row["created_at"] if it.run_at is None else it.run_at),
            attempts=0,
            max_attempts=it.max_attempts,
            lease_owner=None,
            lease_token=None,
            lease_expires_at=None,
            last_error=None if it.suppressed is None else f"suppressed ({it.suppressed})",
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
        # Read after the enqueue statement: a delivery it saw that a prune deleted since
        # left its tombstone, committed with the deletion.
        by_hash = {key_hash(k): k for k in missing if k not in existing}
        if by_hash:
            for r in await rows(cur, "tombstones_by_hashes", {"key_hashes": list(by_hash)}):
                key = by_hash[r["key_hash"]]
                existing[key] = EnqueueResult(
                    delivery=delivery_from_tombstone(r, key), job=None, created=False, pruned=True
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
            # its tombstone expired between two statements: the key is free, try again
            raise StoreError(f"delivery with key {key!r} vanished during enqueue; try again")
    return out


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


async def enqueue_request(
    cur: Cursor,
    items: Sequence[NewDelivery],
    key: str,
    token: str,
    now: float | None,
    respond: Callable[[Sequence[EnqueueResult]], StoredResponse | None],
    fingerprint: str | None = None,
) -> list[EnqueueResult]:
    """``Store.enqueue_request``: the deliveries, then the one request's row."""
    results = await enqueue(cur, items, now)
    first = results[0].delivery.id if results else None
    made = fingerprint if any(r.created for r in results) else None
    await _settle(cur, [(key, token, respond(results), first, made)], now)
    return results


async def enqueue_requests(
    cur: Cursor, items: Sequence[RequestedDelivery], now: float | None, respond: Respond
) -> list[tuple[EnqueueResult, StoredResponse | None]]:
    """The first half of ``Store.handle_requests``: record the deliveries (in key order)
    and complete, or release, the requests' rows."""
    order = sorted(range(len(items)), key=lambda i: items[i].delivery.idempotency_key)
    found = await enqueue(cur, [items[i].delivery for i in order], now)
    results: dict[int, EnqueueResult] = dict(zip(order, found, strict=True))
    out = [(results[i], respond(results[i])) for i in range(len(items))]
    await _settle(
        cur,
        [
            (
                it.delivery.idempotency_key,
                it.lock_token,
                kept,
                result.delivery.id,
                it.fingerprint if result.created else None,
            )
            for it, (result, kept) in zip(items, out, strict=True)
        ],
        now,
    )
    return out


async def _settle(
    cur: Cursor,
    requests: Sequence[tuple[str, str, StoredResponse | None, int | None, str | None]],
    now: float | None,
) -> None:
    """Complete each request's row (key, lock token, response to replay, the delivery
    it names, the fingerprint of a request that created it) while it still holds its
    key (or, having created it, while the key is in progress for the same body), or
    release it (no response): one statement for each."""
    done: dict[str, list[Any]] = {
        "keys": [],
        "tokens": [],
        "codes": [],
        "responses": [],
        "delivery_ids": [],
        "fingerprints": [],
    }
    released: dict[str, list[str]] = {"keys": [], "tokens": []}
    for key, token, kept, delivery_id, made in requests:
        if kept is None:
            released["keys"].append(key)
            released["tokens"].append(token)
        else:
            done["keys"].append(key)
            done["tokens"].append(token)
            done["codes"].append(kept.status_code)
            done["responses"].append(kept.body)
            done["delivery_ids"].append(delivery_id)
            done["fingerprints"].append(made)
    if done["keys"]:
        await run(cur, "complete_requests", {**done, "now": now})
    if released["keys"]:
        await run(cur, "release_requests", released)
