"""Rows of the ledger's tables as the model's values (both dialects' rows: a mapping
by column name)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any, TypeVar

from kirim.frozen import setter
from kirim.model import (
    Attempt,
    AttemptStatus,
    Delivery,
    DeliveryStatus,
    Doubt,
    Job,
    JobStatus,
    Record,
    RecordFilter,
)
from kirim.store.base import ApiToken, RequestSlot, RequestState
from kirim.validation import MAX_ID

Row = Mapping[str, Any]
T = TypeVar("T")
#: the statuses by the names rows hold (a look-up: making the member costs more)
_DELIVERY_STATUS = {str(s): s for s in DeliveryStatus}
_JOB_STATUS = {str(s): s for s in JobStatus}
_ATTEMPT_STATUS = {str(s): s for s in AttemptStatus}
_EVOLVE: dict[type, Callable[[Any, dict[str, Any]], Any]] = {}


def evolve(obj: T, **changes: Any) -> T:
    """``dataclasses.replace`` for the model's frozen dataclasses (none has an
    ``__post_init__``), several times faster: the transitions make a few per delivery."""
    make = _EVOLVE.get(type(obj))
    if make is None:
        make = _EVOLVE[type(obj)] = _evolver(type(obj))
    return make(obj, changes)  # type: ignore[no-any-return]


def _evolver(cls: type) -> Callable[[Any, dict[str, Any]], Any]:
    """A function that copies an instance of ``cls`` field by field, with changes."""
    names = [f.name for f in fields(cls)]
    lines = ["def evolve(obj, changes):", "    new = new_of(cls)"]
    lines += [f"    set_{n}(new, changes[{n!r}] if {n!r} in changes else obj.{n})" for n in names]
    lines.append("    return new")
    # each slot set through its own descriptor (``kirim.frozen``: no look-up by name)
    scope: dict[str, Any] = {"new_of": object.__new__, "cls": cls}
    scope |= {f"set_{n}": setter(cls, n) for n in names}
    exec("\n".join(lines), scope)
    made: Callable[[Any, dict[str, Any]], Any] = scope["evolve"]
    return made


def delivery_from(row: Row, *, payload: bool = True) -> Delivery:
    """``payload=False``: leave the payload out (``{}``), for a transition that only
    writes the delivery's state back and never shows the delivery."""
    raw = row["payload"] if payload else {}
    return Delivery(
        id=row["id"],
        idempotency_key=row["idempotency_key"],
        event_id=row["event_id"],
        recipient=row["recipient"],
        channel=row["channel"],
        payload=json.loads(raw) if isinstance(raw, str) else raw,
        payload_hash=row["payload_hash"],
        status=_DELIVERY_STATUS.get(row["status"]) or DeliveryStatus(row["status"]),
        claim_token=row["claim_token"],
        claimed_by=row["claimed_by"],
        claim_expires_at=row["claim_expires_at"],
        provider_message_id=row["provider_message_id"],
        doubt=Doubt(row["doubt"]) if row["doubt"] else None,
        last_error=row["last_error"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        sent_at=row["sent_at"],
        type=row["type"],
        recipient_id=row["recipient_id"],
        reason=row["reason"],
    )


def job_from(row: Row, prefix: str = "") -> Job:
    """A job from its row (``prefix``: its columns' prefix in a joined row)."""
    return Job(
        id=row[prefix + "id"],
        delivery_id=row[prefix + "delivery_id"],
        status=_JOB_STATUS.get(row[prefix + "status"]) or JobStatus(row[prefix + "status"]),
        run_at=row[prefix + "run_at"],
        attempts=row[prefix + "attempts"],
        max_attempts=row[prefix + "max_attempts"],
        lease_owner=row[prefix + "lease_owner"],
        lease_token=row[prefix + "lease_token"],
        lease_expires_at=row[prefix + "lease_expires_at"],
        last_error=row[prefix + "last_error"],
        created_at=row[prefix + "created_at"],
        updated_at=row[prefix + "updated_at"],
    )


def attempt_from(row: Row) -> Attempt:
    return Attempt(
        id=row["id"],
        delivery_id=row["delivery_id"],
        job_id=row["job_id"],
        number=row["number"],
        provider_request_id=row["provider_request_id"],
        worker_id=row["worker_id"],
        status=_ATTEMPT_STATUS.get(row["status"]) or AttemptStatus(row["status"]),
        provider_message_id=row["provider_message_id"],
        error=row["error"],
        requested_at=row["requested_at"],
        completed_at=row["completed_at"],
        send_deadline=row["send_deadline"],
        settles_at=row["settles_at"],
        provider=row["provider"],
    )


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


def must(row: Row | None) -> Row:
    if row is None:
        raise LookupError("row vanished inside a transaction")
    return row


def job_of(row: Row) -> Job | None:
    """The ``job_*`` columns of a joined row (None when it has no job)."""
    return None if row["job_id"] is None else job_from(row, "job_")


def must_job(row: Row) -> Job:
    """The job of a joined row that must have one (a dead letter's)."""
    job = job_of(row)
    if job is None:
        raise LookupError("a joined row without its job")
    return job


def records_from(rows: Sequence[Row], attempts: Sequence[Row]) -> list[Record]:
    """A page's records: each delivery row (joined with its latest job's ``job_``
    columns) with its attempts, from ``attempts_of_many``'s rows."""
    by_delivery = attempts_by_delivery([r["id"] for r in rows], attempts)
    return [Record(delivery_from(r), job_of(r), by_delivery[r["id"]]) for r in rows]


def attempts_by_delivery(ids: Sequence[int], attempts: Sequence[Row]) -> dict[int, list[Attempt]]:
    """``attempts_of_many``'s rows by delivery, oldest first (an empty list for a
    delivery without attempts)."""
    found: dict[int, list[Attempt]] = {i: [] for i in ids}
    for a in attempts:
        found[a["delivery_id"]].append(attempt_from(a))
    return found


def record_args(where: RecordFilter, cursor: int | None, limit: int) -> tuple[str, dict[str, Any]]:
    """The named query (newest or oldest first) and its arguments for a page."""
    newest = not where.oldest_first
    args = {
        "cursor": (MAX_ID if newest else 0) if cursor is None else max(0, min(cursor, MAX_ID)),
        "status": None if where.status is None else str(where.status),
        "channel": where.channel,
        "doubt": None if where.doubt is None else str(where.doubt),
        "since": where.since,
        "until": where.until,
        "dead": where.dead,
        "limit": None if limit < 0 else limit,  # negative: no limit (NULL on both)
    }
    return ("records_newest" if newest else "records_oldest"), args
