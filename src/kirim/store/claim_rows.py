"""What a claim makes of a due row (``due_jobs``: the delivery's columns and its job's,
``job_``-prefixed), built once from the row.

A claimed row becomes the leased ``Job`` and the processing ``Delivery`` the worker is
handed, and the columns the ledger writes back for both: each straight from the row
and the claim's own values, not model value -> copy -> columns (``Ledger.set_delivery``
reads every column of a model value back by name). The values are the same as
``rules.unleased``/``evolve`` of the decoded row would give and ``_delivery_values``/
``_job_values`` would write (``tests/unit/test_claim_rows.py`` checks both).
"""

from __future__ import annotations

from typing import Any

from kirim.model import Delivery, DeliveryStatus, Job, JobStatus
from kirim.store.rows import Row, evolve

_RUNNING = str(JobStatus.RUNNING)
_PROCESSING = str(DeliveryStatus.PROCESSING)


def leased_job(row: Row, owner: str, token: str, until: float, now: float) -> Job:
    """The row's job leased by ``owner`` under ``token`` until ``until`` (its claim
    counted: one attempt more)."""
    return Job(
        id=row["job_id"],
        delivery_id=row["job_delivery_id"],
        status=JobStatus.RUNNING,
        run_at=row["job_run_at"],
        attempts=row["job_attempts"] + 1,
        max_attempts=row["job_max_attempts"],
        lease_owner=owner,
        lease_token=token,
        lease_expires_at=until,
        last_error=row["job_last_error"],
        created_at=row["job_created_at"],
        updated_at=now,
    )


def leased_job_columns(job: Job) -> dict[str, Any]:
    """The columns ``write_jobs`` sets for a job ``leased_job`` made."""
    return {
        "id": job.id,
        "status": _RUNNING,
        "run_at": job.run_at,
        "attempts": job.attempts,
        "lease_owner": job.lease_owner,
        "lease_token": job.lease_token,
        "lease_expires_at": job.lease_expires_at,
        "last_error": job.last_error,
        "updated_at": job.updated_at,
    }


def processing(current: Delivery, owner: str, token: str, until: float, now: float) -> Delivery:
    """The delivery claimed by ``owner`` under ``token`` until ``until``."""
    return evolve(
        current,
        status=DeliveryStatus.PROCESSING,
        claim_token=token,
        claimed_by=owner,
        claim_expires_at=until,
        updated_at=now,
    )


def processing_columns(
    row: Row, owner: str, token: str, until: float, now: float
) -> dict[str, Any]:
    """The columns ``write_deliveries`` sets for the row's delivery claimed
    (``processing``), but ``id`` and ``released_at`` (``Ledger.set_rows`` adds them)."""
    return {
        "status": _PROCESSING,
        "doubt": row["doubt"] or None,
        "claim_token": token,
        "claimed_by": owner,
        "claim_expires_at": until,
        "provider_message_id": row["provider_message_id"],
        "last_error": row["last_error"],
        "sent_at": row["sent_at"],
        "reason": row["reason"],
        "updated_at": now,
    }
