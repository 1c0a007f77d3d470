"""One notification's history as a pseudo-log, the way the write-up draws races::

    2026-07-21T10:00:01.125Z worker=A job_id=9381 attempt=1 action=provider_request \
        request_id=req-abc

Built from the records alone (delivery, its latest job, every attempt): requests and
their answers, a second worker taking over while a request was unanswered, late
answers, status writes, and the current lease or claim when it has expired. Lines
that show a race are marked ``warn``. The one timeline of kirim: ``kirim status``
draws it as a table, the dashboard and ``GET /v1/notifications/{id}/timeline`` as
log lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kirim.model import CONFIRMED_DELIVERY, AttemptStatus, Delivery, DeliveryStatus, JobStatus
from kirim.text import first_control, visible
from kirim.views import Record, iso


@dataclass(frozen=True, slots=True)
class Event:
    at: float
    action: str
    fields: tuple[tuple[str, Any], ...]
    warn: bool = False
    order: int = 0

    @property
    def line(self) -> str:
        return " ".join([iso(self.at) or "-", self.detail()])

    def detail(self, *, leave_out: frozenset[str] = frozenset()) -> str:
        """The fields as ``key=value`` (empty ones and ``leave_out`` left out)."""
        return " ".join(
            f"{key}={_value(value)}"
            for key, value in self.fields
            if value is not None and value != "" and key not in leave_out
        )

    @property
    def summary(self) -> str:
        """A few words for a table's "what" column: ``attempt 2 requested``."""
        attempt = dict(self.fields).get("attempt")
        words = SUMMARY.get(self.action)
        if words is None or attempt is None:
            return self.action.replace("_", " ")
        return words.format(attempt=attempt)

    def json(self) -> dict[str, Any]:
        return {"at": iso(self.at), "action": self.action, "line": self.line, "warn": self.warn}


SUMMARY = {
    "provider_request": "attempt {attempt} requested",
    "provider_response": "attempt {attempt} answered",
    "claim_taken_over": "attempt {attempt} took over",
    "lease_expired": "lease of attempt {attempt} expired",
    "lease_held": "lease of attempt {attempt} held until",
}


def _value(value: Any) -> str:
    """A field's value as logfmt writes it (``kirim.observe.logging.logfmt_value``'s
    rules): bare, or quoted with ``\\``, ``\"`` and every control character escaped
    (``kirim.text.visible``)."""
    text = str(value)
    if not text or any(c in text for c in ' "=\\') or first_control(text) is not None:
        escaped = text.replace("\\", "\\\\").replace('"', '\\"')
        return '"' + visible(escaped) + '"'
    return text


def events(record: Record, *, now: float) -> list[Event]:
    """What happened to one delivery, oldest first."""
    d, job, attempts = record.delivery, record.job, record.attempts
    out: list[Event] = []
    first_job = attempts[0].job_id if attempts else (job.id if job is not None else None)
    out.append(
        Event(
            d.created_at,
            "enqueued",
            (
                ("job_id", first_job),
                ("action", "enqueued"),
                ("notification_id", d.id),
                ("event_id", d.event_id),
                ("channel", d.channel),
            ),
            order=0,
        )
    )
    # a delivery that failed over names each request's channel (provider=)
    routed = any((a.provider or d.channel) != d.channel for a in attempts)
    for i, a in enumerate(attempts):
        provider = [("provider", a.provider or d.channel)] if routed else []
        # earlier requests still unanswered when this one left: a race, at a glance
        open_before = [
            b for b in attempts[:i] if b.completed_at is None or b.completed_at > a.requested_at
        ]
        taken_from = [b for b in open_before if b.worker_id != a.worker_id]
        if taken_from:
            out.append(
                Event(
                    a.requested_at,
                    "claim_taken_over",
                    (
                        ("worker", a.worker_id),
                        ("job_id", a.job_id),
                        ("attempt", a.number),
                        ("action", "claim_taken_over"),
                        ("from", ",".join(sorted({b.worker_id for b in taken_from}))),
                        ("unanswered", ",".join(b.provider_request_id for b in taken_from)),
                    ),
                    warn=True,
                    order=1,
                )
            )
        request_fields: list[tuple[str, Any]] = [
            ("worker", a.worker_id),
            ("job_id", a.job_id),
            ("attempt", a.number),
            ("action", "provider_request"),
            ("request_id", a.provider_request_id),
            *provider,
        ]
        if open_before:
            request_fields.append(
                ("overlaps", ",".join(f"attempt:{b.number}" for b in open_before))
            )
        if a.completed_at is None:
            request_fields.append(("answer", "none_recorded"))
        out.append(
            Event(
                a.requested_at,
                "provider_request",
                tuple(request_fields),
                warn=bool(open_before) or a.status.in_doubt,
                order=2,
            )
        )
        if a.completed_at is not None:
            later = [b for b in attempts[i + 1 :] if b.requested_at < a.completed_at]
            fields: list[tuple[str, Any]] = [
                ("worker", a.worker_id),
                ("job_id", a.job_id),
                ("attempt", a.number),
                ("action", "provider_response"),
                ("request_id", a.provider_request_id),
                *provider,
                ("result", a.status),
                ("message_id", a.provider_message_id),
                ("error", a.error),
            ]
            if later:
                fields.append(("late", "true"))
            out.append(
                Event(
                    a.completed_at,
                    "provider_response",
                    tuple(fields),
                    warn=bool(later) or a.status is AttemptStatus.UNKNOWN,
                    order=3,
                )
            )
    if d.sent_at is not None:
        out.append(
            Event(
                d.sent_at,
                "status_write",
                (
                    ("action", "status_write"),
                    ("status", DeliveryStatus.SENT),
                    ("message_id", d.provider_message_id),
                ),
                order=4,
            )
        )
    if d.status not in (DeliveryStatus.PENDING, DeliveryStatus.PROCESSING, DeliveryStatus.SENT):
        out.append(
            Event(
                d.updated_at,
                "status_write",
                (
                    ("action", "status_write"),
                    ("status", d.status),
                    ("doubt", d.doubt),
                    ("by", "provider_callback" if d.status in CONFIRMED_DELIVERY else None),
                    ("error", d.last_error),
                ),
                warn=d.status is DeliveryStatus.IN_DOUBT or duplicate(d),
                order=4,
            )
        )
    if job is not None:
        out.append(
            Event(
                job.updated_at,
                "job_state",
                (
                    ("worker", job.lease_owner),
                    ("job_id", job.id),
                    ("action", "job_state"),
                    ("status", job.status),
                    ("attempts", f"{job.attempts}/{job.max_attempts}"),
                    ("error", job.last_error),
                ),
                # a dead job is a delivery's end (a refusal, attempts run out), not a
                # sign of a race: the lines that led to it say whether one happened
                order=5,
            )
        )
        if job.status in (JobStatus.QUEUED, JobStatus.RETRY_SCHEDULED):
            out.append(
                Event(
                    job.run_at,
                    "job_due",
                    (("job_id", job.id), ("action", "job_due"), ("status", job.status)),
                    order=6,
                )
            )
        if job.status is JobStatus.RUNNING and job.lease_expires_at is not None:
            expired = job.lease_expires_at < now
            action = "lease_expired" if expired else "lease_held"
            out.append(
                Event(
                    job.lease_expires_at,
                    action,
                    (
                        ("worker", job.lease_owner),
                        ("job_id", job.id),
                        ("attempt", job.attempts),
                        ("action", action),
                    ),
                    warn=expired,
                    order=6,
                )
            )
    if (
        d.status is DeliveryStatus.PROCESSING
        and d.claim_expires_at is not None
        and d.claim_expires_at < now
    ):
        out.append(
            Event(
                d.claim_expires_at,
                "claim_expired",
                (("worker", d.claimed_by), ("action", "claim_expired")),
                warn=True,
                order=6,
            )
        )
    out.sort(key=lambda e: (e.at, e.order))
    return out


def duplicate(d: Delivery) -> bool:
    """The provider confirmed more than one message for the delivery (a callback's
    measured duplicate, named in its ``last_error``)."""
    return d.status in CONFIRMED_DELIVERY and (d.last_error or "").startswith("measured duplicate")
