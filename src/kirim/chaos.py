"""One chaos vocabulary for kirim's tools: what a provider did with a request, what
happened to each notification, and the tally of a run.

``kirim explore`` (a provider model on a virtual clock), ``kirim simulate`` (a
loopback receiver and real worker processes) and ``kirim demo`` (simulate's fleet
against a receiver that honours nothing) say their findings in these words. The core
of kirim (engine, worker, store, HTTP service) imports none of it.

**A request's fate** (``Fate``), as the provider saw it:

=================  =====================================  ====================
fate               the caller gets                        the provider acted
=================  =====================================  ====================
``accepted``       ``Sent`` (perhaps late)                yes
``accepted_lost``  a timeout or a closed connection       yes
``5xx``/``503``    503: ambiguous to the caller           no
``503_acted``      503, after acting on it                yes
``refused``        connection refused                     no, for certain
``429``            429                                    no, for certain
``400``            400                                    no, for certain
``400_acted``      400, after acting on it                yes
``dead``           410: the address is dead               no
``409``            409: a request of the key in progress  no (the earlier may)
=================  =====================================  ====================

**A notification's verdict** (``Verdict``, ``judge``), from what the user received
and what the ledger reports (``Report``):

- ``delivered``: the user received it; ``duplicate``: more than once;
- ``lost``: the user did not receive it and the ledger reports it neither in doubt
  nor failed (nor denied): kirim would have said nothing of a missing notification;
- ``in_doubt``: reported as maybe delivered (assumed sent, or held in doubt);
- ``unreported_doubt``: a request may have arrived, none is known to have succeeded,
  and the ledger reports it as certain (sent without doubt, or failed; an operator's
  cancel claims nothing);
- ``failed``: reported as not delivered (failed, canceled); ``denied``: suppressed by
  the recipient's preferences; ``unfinished``: still pending or processing.

``tally`` counts the verdicts of a run (``Tally``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kirim.model import (
    CONFIRMED_DELIVERY,
    Attempt,
    AttemptStatus,
    Delivery,
    DeliveryStatus,
    Doubt,
    Job,
    JobStatus,
)

__all__ = [
    "ACTED",
    "CERTAINLY_NOT_ACTED",
    "Fate",
    "Report",
    "Tally",
    "Verdict",
    "judge",
    "report_of",
    "tally",
]


class Fate(enum.StrEnum):
    """What a provider did with one request (see the module docstring)."""

    ACCEPTED = "accepted"
    ACCEPTED_LOST = "accepted_lost"
    UNAVAILABLE = "5xx"
    STATUS_503 = "503"
    ACTED_503 = "503_acted"
    REFUSED = "refused"
    THROTTLED = "429"
    REJECTED = "400"
    ACTED_400 = "400_acted"
    DEAD = "dead"
    IN_PROGRESS = "409"

    @property
    def acted(self) -> bool:
        """The provider acted on the request: its user gets the message."""
        return self in ACTED


#: the fates of a request the provider acted on
ACTED = frozenset({Fate.ACCEPTED, Fate.ACCEPTED_LOST, Fate.ACTED_503, Fate.ACTED_400})
#: the fates of a request the provider certainly did not act on, and said so (a dead
#: address: the service said the device or number is gone, so nothing was shown)
CERTAINLY_NOT_ACTED = frozenset({Fate.REFUSED, Fate.THROTTLED, Fate.REJECTED, Fate.DEAD})


class Verdict(enum.StrEnum):
    """What happened to one notification (see the module docstring)."""

    DELIVERED = "delivered"
    DUPLICATE = "duplicate"
    LOST = "lost"
    IN_DOUBT = "in_doubt"
    UNREPORTED_DOUBT = "unreported_doubt"
    FAILED = "failed"
    DENIED = "denied"
    UNFINISHED = "unfinished"


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """What the ledger says about one notification when the run is over."""

    key: str
    created_at: float
    unfinished: bool = False  # still pending or processing
    failed: bool = False  # reported as not delivered (failed, canceled)
    #: canceled by an operator: no claim that nothing arrived (a request may have)
    canceled: bool = False
    denied: bool = False  # suppressed by the recipient's preferences
    in_doubt: bool = False  # reported as maybe delivered (assumed sent, held in doubt)
    unresolved: bool = False  # a request may have arrived; none is known to have succeeded
    #: was in doubt, then known sent (a late success, a lookup, a provider's callback)
    resolved: bool = False
    retries: int = 0
    dead: bool = False


def report_of(delivery: Delivery, job: Job | None, attempts: Sequence[Attempt]) -> Report:
    """The report of one of kirim's records (a delivery, its job and its attempts)."""
    d = delivery
    doubtful = any(a.status.in_doubt for a in attempts)
    succeeded = any(a.status is AttemptStatus.SUCCEEDED for a in attempts)
    # a lookup that found the key, or the provider's callback, settles the doubt
    resolved = (
        d.status is DeliveryStatus.SENT and d.doubt is Doubt.RESOLVED
    ) or d.status in CONFIRMED_DELIVERY
    return Report(
        key=d.idempotency_key,
        created_at=d.created_at,
        unfinished=d.status in (DeliveryStatus.PENDING, DeliveryStatus.PROCESSING),
        failed=d.status in (DeliveryStatus.FAILED, DeliveryStatus.CANCELED),
        canceled=d.status is DeliveryStatus.CANCELED,
        denied=d.status is DeliveryStatus.SUPPRESSED,
        in_doubt=d.status is DeliveryStatus.IN_DOUBT or d.doubt in (Doubt.ASSUMED_SENT, Doubt.HELD),
        unresolved=doubtful and not (succeeded or resolved),
        resolved=resolved,
        retries=0 if job is None else max(0, job.attempts - 1),
        dead=job is not None and job.status is JobStatus.DEAD,
    )


def judge(report: Report, received: int, copies: int | None = None) -> frozenset[Verdict]:
    """The verdicts of one notification: ``received``, the requests for its key the
    provider acted on; ``copies``, the copies its user got (default: ``received``; a
    provider that honours keys makes one of many requests)."""
    copies = received if copies is None else copies
    found = set()
    if received > 0:
        found.add(Verdict.DELIVERED)
    elif not (report.in_doubt or report.failed or report.denied):
        found.add(Verdict.LOST)
    if copies > 1:
        found.add(Verdict.DUPLICATE)
    if report.in_doubt:
        found.add(Verdict.IN_DOUBT)
    elif report.unresolved and not report.canceled:
        found.add(Verdict.UNREPORTED_DOUBT)
    if report.failed:
        found.add(Verdict.FAILED)
    if report.denied:
        found.add(Verdict.DENIED)
    if report.unfinished:
        found.add(Verdict.UNFINISHED)
    return frozenset(found)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tally:
    """The verdicts of a run, counted, with its retries and dead letters."""

    notifications: int = 0
    delivered: int = 0
    duplicates: int = 0
    lost: int = 0
    in_doubt: int = 0
    unreported_in_doubt: int = 0
    resolved: int = 0
    failed: int = 0
    denied: int = 0
    unfinished: int = 0
    retries: int = 0
    dead_lettered: int = 0

    def __add__(self, other: Tally) -> Tally:
        """Two runs' tallies, summed."""
        return Tally(**{f: getattr(self, f) + getattr(other, f) for f in self.__dataclass_fields__})

    def as_dict(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @property
    def promise_kept(self) -> bool:
        """Nothing lost, nothing unfinished, every unresolved doubt reported, no
        duplicate (a channel that chose at-least-once judges duplicates itself)."""
        return not (self.lost or self.unfinished or self.unreported_in_doubt or self.duplicates)


def tally(
    reports: Iterable[Report], received: Mapping[str, int], copies: Mapping[str, int] | None = None
) -> Tally:
    """The tally of a run: each report judged by what its provider ``received`` (per
    key) and the ``copies`` the users got (per key; default: ``received``)."""
    count = dict.fromkeys(Verdict, 0)
    n = retries = dead = resolved = 0
    for report in reports:
        n += 1
        got = received.get(report.key, 0)
        for verdict in judge(report, got, None if copies is None else copies.get(report.key, 0)):
            count[verdict] += 1
        retries += report.retries
        dead += report.dead
        resolved += report.resolved
    return Tally(
        notifications=n,
        delivered=count[Verdict.DELIVERED],
        duplicates=count[Verdict.DUPLICATE],
        lost=count[Verdict.LOST],
        in_doubt=count[Verdict.IN_DOUBT],
        unreported_in_doubt=count[Verdict.UNREPORTED_DOUBT],
        resolved=resolved,
        failed=count[Verdict.FAILED],
        denied=count[Verdict.DENIED],
        unfinished=count[Verdict.UNFINISHED],
        retries=retries,
        dead_lettered=dead,
    )
