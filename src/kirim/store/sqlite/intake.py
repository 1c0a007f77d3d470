"""SQLite: what comes in. Enqueue (deliveries and their jobs, once per idempotency key;
digests and throttles by ``kirim.store.admission``) and the HTTP service's idempotent
requests, inside the caller's transaction."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

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
from kirim.store.rows import delivery_from, job_from, must, request_slot_from
from kirim.store.sequence import callers_time
from kirim.store.sqlite.driver import Q, drive


def begin_requests(
    conn: sqlite3.Connection, items: Sequence[RequestBegin], now: float, hold: float
) -> list[RequestSlot]:
    """Take each request's idempotency key, or say who holds (or held) it."""
    out = []
    for it in items:
        args = {
            "key": it.idempotency_key,
            "fingerprint": it.fingerprint,
            "token": it.lock_token,
            "until": now + hold,
            "now": now,
        }
        row = conn.execute(Q["insert_request"], args).fetchone()
        if row is None:
            row = conn.execute(Q["take_over_request"], args).fetchone()
        if row is not None:
            out.append(RequestSlot(state=RequestState.ACQUIRED, fingerprint=it.fingerprint))
            continue
        held = must(conn.execute(Q["request_by_key"], args).fetchone())
        out.append(request_slot_from(held))
    return out


def enqueue_requests(
    conn: sqlite3.Connection, items: Sequence[RequestedDelivery], now: float, respond: Respond
) -> list[tuple[EnqueueResult, StoredResponse | None]]:
    """Record the requests' deliveries, then complete (or release) their rows."""
    results = enqueue(conn, [it.delivery for it in items], now)
    out = []
    for it, result in zip(items, results, strict=True):
        kept = respond(result)
        made = it.fingerprint if result.created else None
        _settle(
            conn, it.delivery.idempotency_key, it.lock_token, kept, result.delivery.id, now, made
        )
        out.append((result, kept))
    return out


def enqueue_request(
    conn: sqlite3.Connection,
    items: Sequence[NewDelivery],
    key: str,
    token: str,
    now: float,
    respond: Callable[[Sequence[EnqueueResult]], StoredResponse | None],
    fingerprint: str | None = None,
) -> list[EnqueueResult]:
    """``Store.enqueue_request``: the deliveries, then the one request's row."""
    results = enqueue(conn, items, now)
    first = results[0].delivery.id if results else None
    made = fingerprint if any(r.created for r in results) else None
    _settle(conn, key, token, respond(results), first, now, made)
    return results


def _settle(
    conn: sqlite3.Connection,
    key: str,
    token: str,
    kept: StoredResponse | None,
    delivery_id: int | None,
    now: float,
    made: str | None = None,
) -> None:
    """Complete a request's row with the response to replay, naming ``delivery_id``, or
    release it (``kept`` None), while the request still holds its key (``token``); or,
    ``made`` (the fingerprint of a request that created the deliveries), while the key
    is in progress for the same body."""
    args = {"key": key, "token": token, "now": now, "fingerprint": made}
    if kept is None:
        conn.execute(Q["release_request"], {k: v for k, v in args.items() if k != "fingerprint"})
        return
    completed = {
        **args,
        "status_code": kept.status_code,
        "response": kept.body,
        "delivery_id": delivery_id,
    }
    conn.execute(Q["complete_request"], completed)


def enqueue(
    conn: sqlite3.Connection, items: Sequence[NewDelivery], now: float
) -> list[EnqueueResult]:
    """Insert deliveries and their jobs, two statements for the batch; an existing key
    returns the existing row, a pruned one (its tombstone kept) the delivery rebuilt
    from the tombstone. Events for digests and throttles: ``kirim.store.admission``,
    in the same transaction."""
    if not items:
        return []
    admission.refuse_unstorable(items)
    inserted = _insert(conn, items, now)
    if not admission.needed(items):
        return [_given(r) for r in inserted]
    return drive(admission.admit(items, inserted, now), conn, callers_time)


def _given(result: EnqueueResult | None) -> EnqueueResult:
    assert result is not None
    return result


def _insert(
    conn: sqlite3.Connection, items: Sequence[NewDelivery], now: float
) -> list[EnqueueResult | None]:
    """The plain items' results (``admission.plain``; None for the others)."""
    first: dict[str, NewDelivery] = {}
    for it in items:
        if admission.plain(it):
            first.setdefault(it.idempotency_key, it)
    if not first:
        return [None] * len(items)
    given = [
        {
            "key": it.idempotency_key,
            "key_hash": key_hash(it.idempotency_key),
            "event_id": it.event_id,
            "recipient": it.recipient,
            "channel": it.channel,
            "payload": it.payload_json,
            "payload_hash": it.payload_hash,
            "type": it.type,
            "recipient_id": it.recipient_id,
            "suppressed": it.suppressed,
        }
        for it in first.values()
    ]
    args = {"items": json.dumps(given), "now": now}
    created = {r[1]: r[0] for r in conn.execute(Q["insert_deliveries"], args)}
    jobs: dict[int, int] = {}
    wanted: dict[int, dict[str, Any]] = {}
    if created:
        for key, delivery_id in sorted(created.items(), key=lambda kv: kv[1]):
            wanted[delivery_id] = _job_of(first[key], delivery_id, now)
        args = {"items": json.dumps(list(wanted.values())), "now": now}
        jobs = {r[1]: r[0] for r in conn.execute(Q["insert_jobs_of"], args)}
    out: list[EnqueueResult | None] = []
    for it in items:
        key = it.idempotency_key
        delivery_id = created.get(key)
        if not admission.plain(it):
            out.append(None)
        elif delivery_id is not None and it is first[key]:
            # both rows as inserted: built from what was given, nothing read back
            delivery = _inserted(it, delivery_id, now)
            job = _inserted_job(wanted[delivery_id], jobs[delivery_id], now)
            out.append(EnqueueResult(delivery=delivery, job=job, created=True))
        else:  # known before, or the same key again in this batch
            out.append(_known(conn, key, key_hash(key)))
    return out


def _inserted(it: NewDelivery, delivery_id: int, now: float) -> Delivery:
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


def _inserted_job(values: dict[str, Any], job_id: int, now: float) -> Job:
    """The job row ``insert_jobs_of`` wrote from ``values`` (``_job_of``)."""
    return Job(
        id=job_id,
        delivery_id=values["delivery_id"],
        status=JobStatus(values["status"]),
        run_at=float(values["run_at"]),
        attempts=0,
        max_attempts=values["max_attempts"],
        lease_owner=None,
        lease_token=None,
        lease_expires_at=None,
        last_error=values["last_error"],
        created_at=now,
        updated_at=now,
    )


def _job_of(it: NewDelivery, delivery_id: int, now: float) -> dict[str, object]:
    """The job of a delivery just inserted: queued, or completed if it is suppressed."""
    return {
        "delivery_id": delivery_id,
        "status": "queued" if it.suppressed is None else "completed",
        "run_at": now if it.run_at is None else it.run_at,
        "max_attempts": it.max_attempts,
        "last_error": None if it.suppressed is None else f"suppressed ({it.suppressed})",
    }


def _known(conn: sqlite3.Connection, key: str, digest: str) -> EnqueueResult:
    """The key's delivery, or the tombstone it left when it was pruned."""
    existing = conn.execute(Q["delivery_by_key"], {"key": key}).fetchone()
    if existing is not None:
        return EnqueueResult(
            delivery=delivery_from(existing), job=latest_job(conn, existing["id"]), created=False
        )
    tombstone = must(conn.execute(Q["tombstone_by_hash"], {"key_hash": digest}).fetchone())
    return EnqueueResult(
        delivery=delivery_from_tombstone(tombstone, key), job=None, created=False, pruned=True
    )


def latest_job(conn: sqlite3.Connection, delivery_id: int) -> Job | None:
    row = conn.execute(Q["latest_job"], {"delivery_id": delivery_id}).fetchone()
    return None if row is None else job_from(row)
