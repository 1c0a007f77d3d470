"""Counts in kirim's messages are written in their number: 1 delivery, 3 deliveries."""

from __future__ import annotations

from kirim.cli.prune import summary
from kirim.doctor.audit import plural as doctor_plural
from kirim.store.retention import PruneResult
from kirim.text import plural


def test_plural_follows_the_english_rule() -> None:
    """One is singular; a consonant and y make ies; the rest take s; thousands are
    separated."""
    assert plural(1, "delivery") == "1 delivery"
    assert plural(3, "delivery") == "3 deliveries"
    assert plural(0, "key") == "0 keys"
    assert plural(2, "day") == "2 days"
    assert plural(1204, "request") == "1,204 requests"
    assert plural(2, "HTTP request row") == "2 HTTP request rows"


def test_doctor_counts_deliveries_in_their_number() -> None:
    """kirim doctor's messages say 3 deliveries, not 3 deliverys."""
    assert doctor_plural(3, "delivery") == "3 deliveries"
    assert doctor_plural(1, "attempt") == "1 attempt"


def test_prune_says_one_delivery_and_one_key() -> None:
    """A prune of one delivery says 1 delivery, 1 job, 1 attempt and 1 key."""
    one = PruneResult(deliveries=1, jobs=1, attempts=1, requests=1, tombstones_written=1)
    assert summary(one) == (
        "pruned 1 delivery (1 job, 1 attempt, 1 HTTP request row), 0 expired keys; "
        "1 key kept as a tombstone"
    )
    many = PruneResult(deliveries=2, jobs=2, attempts=3, tombstones_written=2, dry_run=True)
    assert summary(many).startswith(
        "would prune 2 deliveries (2 jobs, 3 attempts, 0 HTTP request rows), 0 expired keys; "
        "2 keys would be kept as tombstones"
    )


def test_the_receiver_counts_requests_in_their_number() -> None:
    """python -m kirim.receiver says 1 request and 1 notification, not 1 requests."""
    from kirim.devtools.receiver import counts

    assert counts(1, 1, 0) == "1 request, 1 notification, 0 received more than once"
    assert counts(2, 1, 1) == "2 requests, 1 notification, 1 received more than once"
