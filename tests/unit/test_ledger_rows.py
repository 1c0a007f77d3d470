"""A transition's ledger: values written straight over the rows read as they now stand."""

from __future__ import annotations

import enum
from typing import Any

from kirim.model import DeliveryStatus, Doubt, JobStatus
from kirim.store import rules
from kirim.store.transitions import Ledger


def _delivery(**over: Any) -> dict[str, Any]:
    row = {
        "id": 1, "idempotency_key": "k", "event_id": "e", "recipient": "r", "channel": "c",
        "payload": "{}", "payload_hash": "h", "status": "processing", "claim_token": "t",
        "claimed_by": "w", "claim_expires_at": 9.0, "provider_message_id": None,
        "doubt": None, "released_at": 3.0, "last_error": None, "created_at": 1.0,
        "updated_at": 2.0, "sent_at": None, "type": None, "recipient_id": None,
        "reason": None,
    }  # fmt: skip
    return row | over


def _job(**over: Any) -> dict[str, Any]:
    row = {
        "id": 5, "delivery_id": 1, "status": "running", "run_at": 1.0, "attempts": 1,
        "max_attempts": 3, "lease_owner": "w", "lease_token": "t", "lease_expires_at": 9.0,
        "last_error": None, "created_at": 1.0, "updated_at": 2.0,
    }  # fmt: skip
    return row | over


def _written() -> dict[str, Any]:
    return {
        "status": "sent", "doubt": None, "claim_token": None, "claimed_by": None,
        "claim_expires_at": None, "provider_message_id": "m", "last_error": None,
        "sent_at": 4.0, "reason": None, "updated_at": 4.0,
    }  # fmt: skip


def test_rows_written_over_are_read_back_as_written() -> None:
    """After ``set_rows``, the delivery and the job read as the values written (not as
    the rows first read), and the write-back carries id and released_at."""
    ledger = Ledger([_delivery()], [_job()])
    assert ledger.delivery(1) is not None  # read (and kept) before the write
    job_values = {
        "status": "completed", "run_at": 1.0, "attempts": 1, "lease_owner": None,
        "lease_token": None, "lease_expires_at": None, "last_error": None, "updated_at": 4.0,
    }  # fmt: skip
    ledger.set_rows(1, _written(), 5, job_values)
    d, j = ledger.delivery(1), ledger.job(5)
    assert d is not None
    assert j is not None
    assert (d.status, d.claim_token, d.provider_message_id) == (DeliveryStatus.SENT, None, "m")
    assert (j.status, j.lease_token) == (JobStatus.COMPLETED, None)
    row = ledger.delivery_row(1)
    assert row is not None
    assert row["released_at"] == 3.0
    assert row["idempotency_key"] == "k"
    writes = {q.name: q.args["items"] for q in ledger.writes()}
    assert writes["write_deliveries"] == [{**_written(), "id": 1, "released_at": 3.0}]
    assert writes["write_jobs"] == [{**job_values, "id": 5}]


def test_a_row_never_written_is_the_row_read() -> None:
    ledger = Ledger([_delivery()], [_job()])
    assert ledger.delivery_row(1) == _delivery()
    assert ledger.job_row(5) == _job()
    assert ledger.delivery_row(2) is None


def test_a_commit_written_straight_over_rows_holds_no_enum_member() -> None:
    """The plain finish's columns are ``committed_columns`` with the statuses as the
    strings rows hold (what the model path writes for the same decision)."""
    w = rules.Written(
        status=DeliveryStatus.IN_DOUBT, doubt=Doubt.HELD, message_id="m",
        job_status=JobStatus.DEAD, run_at=None, error="e", refund=False,
    )  # fmt: skip
    row = rules.committed_row(_delivery(), w, 4.0)
    job = rules.job_committed_row(_job(), w, 4.0)
    assert not [v for v in [*row.values(), *job.values()] if isinstance(v, enum.Enum)]
    assert row == {**rules.committed_columns(_delivery(), w, 4.0), "status": "in_doubt",
                   "doubt": "held"}  # fmt: skip
    assert job == {**rules.job_committed_columns(_job(), w, 4.0), "status": "dead"}
