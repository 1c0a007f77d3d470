"""Records as JSON: what the CLI's ``--json`` and the HTTP API both print.

Times are ISO-8601 UTC strings ending in ``Z``, at millisecond precision (the form
``kirim analyze`` reads too).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kirim.model import Attempt, Job, Record
from kirim.preferences import Preferences
from kirim.store.base import ApiToken


def iso(epoch: float | None) -> str | None:
    """Epoch seconds as ``YYYY-MM-DDTHH:MM:SS.fffZ``; ``None`` stays ``None``."""
    if epoch is None:
        return None
    moment = datetime.fromtimestamp(round(epoch, 3), UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def job_json(job: Job | None) -> dict[str, Any] | None:
    if job is None:
        return None
    return {
        "id": job.id,
        "status": str(job.status),
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "run_at": iso(job.run_at),
        "lease_owner": job.lease_owner,
        "lease_expires_at": iso(job.lease_expires_at),
        "last_error": job.last_error,
        "created_at": iso(job.created_at),
        "updated_at": iso(job.updated_at),
    }


def attempt_json(a: Attempt) -> dict[str, Any]:
    return {
        "id": a.id,
        "job_id": a.job_id,
        "number": a.number,
        "provider_request_id": a.provider_request_id,
        "status": str(a.status),
        "provider_message_id": a.provider_message_id,
        "worker_id": a.worker_id,
        # the channel the request went to (the delivery's own, or a fallback)
        "provider": a.provider,
        "error": a.error,
        "requested_at": iso(a.requested_at),
        "completed_at": iso(a.completed_at),
    }


def delivery_json(record: Record) -> dict[str, Any]:
    """The delivery's fields, its ``job`` (or null) and its ``attempts``, in order."""
    d, job, attempts = record.delivery, record.job, record.attempts
    return {
        "id": d.id,
        "idempotency_key": d.idempotency_key,
        "event_id": d.event_id,
        "recipient": d.recipient,
        "channel": d.channel,
        # notify_event's: the notification type, and the recipient whose preferences rule it
        "type": d.type,
        "recipient_id": d.recipient_id,
        "payload": d.payload,
        "status": str(d.status),
        "doubt": None if d.doubt is None else str(d.doubt),
        # why it is suppressed (kirim.preferences.Reason), else null
        "reason": d.reason,
        "provider_message_id": d.provider_message_id,
        "last_error": d.last_error,
        "claimed_by": d.claimed_by,
        "claim_expires_at": iso(d.claim_expires_at),
        "created_at": iso(d.created_at),
        "updated_at": iso(d.updated_at),
        "sent_at": iso(d.sent_at),
        "job": job_json(job),
        "attempts": [attempt_json(a) for a in attempts],
    }


def preferences_json(prefs: Preferences) -> dict[str, Any]:
    """A recipient's preferences: its id, the stored document, when it was set."""
    return {
        "recipient_id": prefs.recipient_id,
        **prefs.to_json(),
        "updated_at": iso(prefs.updated_at),
    }


def token_json(token: ApiToken) -> dict[str, Any]:
    return {
        "id": token.id,
        "name": token.name,
        "prefix": token.prefix,
        "created_at": iso(token.created_at),
        "revoked_at": iso(token.revoked_at),
    }


__all__ = [
    "Record",
    "attempt_json",
    "delivery_json",
    "iso",
    "job_json",
    "preferences_json",
    "token_json",
]
