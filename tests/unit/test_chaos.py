"""The chaos vocabulary: each notification judged the same way by explore, simulate and
the demo."""

from __future__ import annotations

import dataclasses

from kirim.chaos import (
    ACTED,
    CERTAINLY_NOT_ACTED,
    Fate,
    Report,
    Verdict,
    judge,
    report_of,
    tally,
)
from kirim.model import DeliveryStatus, Doubt, JobStatus
from record_kit import delivery_row, job_row


def _report(**flags: bool) -> Report:
    return Report(key="k", created_at=0.0, **flags)


def test_a_notification_neither_received_nor_reported_is_lost() -> None:
    """Not received and reported as neither in doubt nor failed nor denied: lost."""
    assert judge(_report(), received=0) == {Verdict.LOST}
    assert judge(_report(unfinished=True), received=0) == {Verdict.LOST, Verdict.UNFINISHED}
    assert Verdict.LOST not in judge(_report(in_doubt=True), received=0)
    assert Verdict.LOST not in judge(_report(failed=True), received=0)
    assert Verdict.LOST not in judge(_report(denied=True), received=0)


def test_copies_make_a_duplicate_and_requests_a_delivery() -> None:
    """Two copies for the user are a duplicate; two requests to a provider that
    honours keys (one copy) are one delivery."""
    assert judge(_report(), received=2) == {Verdict.DELIVERED, Verdict.DUPLICATE}
    assert judge(_report(), received=2, copies=1) == {Verdict.DELIVERED}


def test_a_doubt_is_reported_or_unreported() -> None:
    """An unresolved doubt the ledger reports is in doubt; one it hides is unreported."""
    assert Verdict.IN_DOUBT in judge(_report(in_doubt=True, unresolved=True), received=1)
    assert judge(_report(unresolved=True, failed=True), received=0) == {
        Verdict.UNREPORTED_DOUBT,
        Verdict.FAILED,
    }


def test_the_tally_counts_each_verdict() -> None:
    """A run's tally counts the verdicts of its notifications, its retries and dead letters."""
    reports = [
        Report(key="a", created_at=0.0, retries=2),
        Report(key="b", created_at=0.0, in_doubt=True, unresolved=True),
        Report(key="c", created_at=0.0, failed=True, dead=True),
        Report(key="d", created_at=0.0),
    ]
    found = tally(reports, {"a": 2, "b": 1}, {"a": 2, "b": 1})
    assert (found.notifications, found.delivered, found.duplicates) == (4, 2, 1)
    assert (found.lost, found.in_doubt, found.failed) == (1, 1, 1)
    assert (found.retries, found.dead_lettered, found.unreported_in_doubt) == (2, 1, 0)
    assert not found.promise_kept
    assert tally(reports[1:3], {"b": 1}).promise_kept


def test_a_fate_says_whether_the_provider_acted() -> None:
    """A fate the provider acted on is never one it certainly did not act on."""
    assert Fate.ACCEPTED_LOST.acted
    assert not Fate.UNAVAILABLE.acted
    assert not ACTED & CERTAINLY_NOT_ACTED
    assert {str(f) for f in CERTAINLY_NOT_ACTED} == {"refused", "429", "400", "dead"}


def test_a_record_is_reported_as_the_ledger_says() -> None:
    """A delivery assumed sent is in doubt, a suppressed one denied, one a provider's
    callback confirmed resolved; a dead job is counted."""
    delivery = delivery_row(
        status=DeliveryStatus.SENT, doubt=Doubt.ASSUMED_SENT, created_at=3.0, updated_at=3.0
    )
    job = job_row(status=JobStatus.DEAD, attempts=3, max_attempts=3)
    report = report_of(delivery, job, [])
    assert report.in_doubt
    assert report.dead
    assert report.retries == 2
    suppressed = dataclasses.replace(delivery, status=DeliveryStatus.SUPPRESSED, doubt=None)
    assert report_of(suppressed, None, []).denied
    confirmed = dataclasses.replace(delivery, status=DeliveryStatus.DELIVERED, doubt=None)
    assert report_of(confirmed, None, []).resolved


def test_tallies_add_up() -> None:
    """Two runs' tallies sum field by field."""
    one = tally([Report(key="a", created_at=0.0, retries=1)], {"a": 1})
    both = one + tally([Report(key="b", created_at=0.0)], {})
    assert both.as_dict() == {**one.as_dict(), "notifications": 2, "lost": 1}


def test_a_cancel_or_a_callback_claims_no_certainty_it_lacks() -> None:
    """A canceled delivery whose request may have arrived hides no doubt."""
    assert Verdict.UNREPORTED_DOUBT not in judge(
        _report(failed=True, canceled=True, unresolved=True), received=1
    )
