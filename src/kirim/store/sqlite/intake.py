"""SQLite: what comes in. Enqueue (deliveries and their jobs, once per idempotency key)
and the HTTP service's idempotent requests, inside the caller's transaction."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from kirim.model import EnqueueResult, Job
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
from kirim.store.rows import Row, delivery_from, job_from, must, request_slot_from
from kirim.store.sqlite.driver import Q


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
        args = {"key": it.delivery.idempotency_key, "token": it.lock_token, "now": now}
        kept = respond(result)
        if kept is None:
            conn.execute(Q["release_request"], args)
        else:
            conn.execute(
                Q["complete_request"],
                {
                    **args,
                    "status_code": kept.status_code,
                    "response": kept.body,
                    "delivery_id": result.delivery.id,
                },
            )
        out.append((result, kept))
    return out


def enqueue(
    conn: sqlite3.Connection, items: Sequence[NewDelivery], now: float
) -> list[EnqueueResult]:
    """Insert deliveries and their jobs, two statements for the batch; an existing key
    returns the existing row, a pruned one (its tombstone kept) the delivery rebuilt
    from the tombstone."""
    if not items:
        return []
    first: dict[str, NewDelivery] = {}
    for it in items:
        first.setdefault(it.idempotency_key, it)
    given = [
        {
            "key": it.idempotency_key,
            "key_hash": key_hash(it.idempotency_key),
            "event_id": it.event_id,
            "recipient": it.recipient,
            "channel": it.channel,
            "payload": it.payload_json,
            "payload_hash": it.payload_hash,
        }
        for it in first.values()
    ]
    args = {"items": json.dumps(given), "now": now}
    created = {r["idempotency_key"]: r for r in conn.execute(Q["insert_deliveries"], args)}
    jobs: dict[int, Row] = {}
    if created:
        wanted = [
            {
                "delivery_id": row["id"],
                "run_at": now if first[key].run_at is None else first[key].run_at,
                "max_attempts": first[key].max_attempts,
            }
            for key, row in sorted(created.items(), key=lambda kv: kv[1]["id"])
        ]
        args = {"items": json.dumps(wanted), "now": now}
        jobs = {j["delivery_id"]: j for j in conn.execute(Q["insert_jobs_of"], args)}
    out = []
    for it in items:
        key = it.idempotency_key
        row = created.get(key)
        if row is not None and it is first[key]:  # both rows as inserted: nothing to read
            job = job_from(jobs[row["id"]])
            out.append(EnqueueResult(delivery=delivery_from(row), job=job, created=True))
        else:  # known before, or the same key again in this batch
            out.append(_known(conn, key, key_hash(key)))
    return out


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
