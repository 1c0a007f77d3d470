"""Delivery and Job rows as the store reads them, built for tests that need a record
without a database (the views, the state machine, the worker's parts): every field
has a plain default, and a test gives only the ones it is about."""

from __future__ import annotations

from typing import Any

from kirim.model import Delivery, DeliveryStatus, Job, JobStatus

_DELIVERY: dict[str, Any] = {
    "id": 1,
    "idempotency_key": "k",
    "event_id": "e",
    "recipient": "u",
    "channel": "push",
    "payload": {},
    "payload_hash": "h",
    "status": DeliveryStatus.PENDING,
    "claim_token": None,
    "claimed_by": None,
    "claim_expires_at": None,
    "provider_message_id": None,
    "doubt": None,
    "last_error": None,
    "created_at": 0.0,
    "updated_at": 0.0,
    "sent_at": None,
}

_JOB: dict[str, Any] = {
    "id": 1,
    "delivery_id": 1,
    "status": JobStatus.QUEUED,
    "run_at": 0.0,
    "attempts": 0,
    "max_attempts": 3,
    "lease_owner": None,
    "lease_token": None,
    "lease_expires_at": None,
    "last_error": None,
    "created_at": 0.0,
    "updated_at": 0.0,
}


def delivery_row(**fields: Any) -> Delivery:
    """A delivery (pending, key ``k``, on ``push``) with ``fields`` instead."""
    return Delivery(**(_DELIVERY | fields))


def job_row(**fields: Any) -> Job:
    """A job (queued, of delivery 1, 3 attempts allowed) with ``fields`` instead."""
    return Job(**(_JOB | fields))


def claimed_rows(delivery_id: int = 1, *, by: str = "A") -> tuple[Delivery, Job]:
    """A delivery processing under a claim of worker ``by`` and its running job (its
    second attempt of five), both leased until 100 (the job's id is the delivery's)."""
    delivery = delivery_row(
        id=delivery_id,
        status=DeliveryStatus.PROCESSING,
        claim_token="t",
        claimed_by=by,
        claim_expires_at=100.0,
    )
    job = job_row(
        id=delivery_id,
        delivery_id=delivery_id,
        status=JobStatus.RUNNING,
        attempts=2,
        max_attempts=5,
        lease_owner=by,
        lease_token="t",
        lease_expires_at=100.0,
    )
    return delivery, job
