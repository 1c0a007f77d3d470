"""SQLite: what comes in. Enqueue (deliveries and their jobs, once per idempotency key)
and the HTTP service's idempotent requests, inside the caller's transaction."""

from __future__ import annotations

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
from kirim.store.rows import delivery_from, job_from, must, request_slot_from
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
    """Insert deliveries and their jobs; an existing key returns the existing row, a
    pruned one (its tombstone kept) the delivery rebuilt from the tombstone."""
    out = []
    for it in items:
        digest = key_hash(it.idempotency_key)
        row = conn.execute(
            Q["insert_delivery"],
            {
                "key": it.idempotency_key,
                "key_hash": digest,
                "event_id": it.event_id,
                "recipient": it.recipient,
                "channel": it.channel,
                "payload": it.payload_json,
                "payload_hash": it.payload_hash,
                "now": now,
            },
        ).fetchone()
        if row is None:
            out.append(_known(conn, it.idempotency_key, digest))
            continue
        run_at = now if it.run_at is None else it.run_at
        job = conn.execute(
            Q["insert_job"],
            {
                "delivery_id": row["id"],
                "run_at": run_at,
                "max_attempts": it.max_attempts,
                "now": now,
            },
        ).fetchone()
        # both rows as inserted (RETURNING *): nothing to read again
        out.append(
            EnqueueResult(delivery=delivery_from(row), job=job_from(must(job)), created=True)
        )
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
