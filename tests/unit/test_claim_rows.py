"""A claim's values built straight from a due row are those of the longer way: the
row decoded, copied with the claim's changes, and read back into columns."""

from __future__ import annotations

from typing import Any

import pytest

from kirim.store import claim_rows
from kirim.store.rows import delivery_from, evolve, job_of
from kirim.store.transitions import Ledger, _delivery_values, _job_values


def _due(**over: Any) -> dict[str, Any]:
    row = {
        "id": 1, "idempotency_key": "k", "event_id": "e", "recipient": "r", "channel": "c",
        "payload": '{"a": 1}', "payload_hash": "h", "status": "pending", "claim_token": None,
        "claimed_by": None, "claim_expires_at": None, "provider_message_id": None,
        "doubt": None, "released_at": 3.0, "last_error": "before", "created_at": 1.0,
        "updated_at": 2.0, "sent_at": None, "type": "t", "recipient_id": "u", "reason": "r0",
        "job_id": 5, "job_delivery_id": 1, "job_status": "queued", "job_run_at": 1.5,
        "job_attempts": 2, "job_max_attempts": 3, "job_lease_owner": None,
        "job_lease_token": None, "job_lease_expires_at": None, "job_last_error": "x",
        "job_created_at": 1.0, "job_updated_at": 2.0,
    }  # fmt: skip
    return row | over


ROWS = [
    _due(),
    _due(status="processing", claim_token="old", claimed_by="w0", claim_expires_at=0.5),
    _due(doubt="held", provider_message_id="m", sent_at=1.2, reason=None, last_error=None),
    _due(job_status="retry_scheduled", job_last_error=None, released_at=None),
]


@pytest.mark.parametrize("row", ROWS)
def test_the_claim_values_are_those_of_the_decoded_row(row: dict[str, Any]) -> None:
    token, owner, until, now = "tok", "w1", 40.0, 10.0
    job = job_of(row)
    assert job is not None
    want_job = evolve(
        job,
        status="running",
        attempts=job.attempts + 1,
        lease_owner=owner,
        lease_token=token,
        lease_expires_at=until,
        updated_at=now,
    )
    leased = claim_rows.leased_job(row, owner, token, until, now)
    assert leased == evolve(want_job, status=leased.status)
    assert str(leased.status) == "running"
    assert claim_rows.leased_job_columns(leased) == _job_values(leased)

    current = delivery_from(row)
    delivery = claim_rows.processing(current, owner, token, until, now)
    want = evolve(
        current,
        status=delivery.status,
        claim_token=token,
        claimed_by=owner,
        claim_expires_at=until,
        updated_at=now,
    )
    assert delivery == want
    assert str(delivery.status) == "processing"
    # what the ledger writes back: the columns set_delivery would read off the value
    ledger = Ledger([row])
    ledger.set_rows(1, claim_rows.processing_columns(row, owner, token, until, now))
    assert ledger.delivery_row(1) == {**row, **_delivery_values(delivery, row["released_at"])}
