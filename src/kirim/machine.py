"""The delivery's state machine: its statuses, the edges between them and who takes
each, in one table (docs/design.md, "The records and their edges").

The worker's decisions, the reaper, the store's transitions, the operator's verbs and
the dashboard ask this module what a delivery may do (``can_cancel``, ``can_retry``,
``can_reconcile``, ``reopens``); nobody re-derives it. Every change of status the
store's transitions write is checked against ``EDGES`` (``check``): one that is not
an edge is logged as an error (``kirim.machine``, event ``unknown_edge``), and the
test suite and the explorer fail on it, so the table cannot drift from the code.
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from kirim.model import Delivery, DeliveryStatus, Doubt, Job, JobStatus

log = logging.getLogger("kirim.machine")

P = DeliveryStatus.PENDING
R = DeliveryStatus.PROCESSING
S = DeliveryStatus.SENT
F = DeliveryStatus.FAILED
C = DeliveryStatus.CANCELED
D = DeliveryStatus.IN_DOUBT
OK = DeliveryStatus.DELIVERED
B = DeliveryStatus.BOUNCED
X = DeliveryStatus.SUPPRESSED


class By(enum.StrEnum):
    """Who takes an edge."""

    INTAKE = "intake"  # the enqueue (a throttle or preferences at enqueue)
    CLAIM = "claim"  # a worker's claim (preferences checked again at claim)
    WORKER = "worker"  # a claim's own finish
    LATE = "late answer"  # a request's answer after its claim was lost (a fact)
    REAPER = "reaper"  # a lease that expired on the final attempt
    OPERATOR = "operator"  # cancel, retry, reconcile
    PROVIDER = "provider callback"  # the provider's word on a message


@dataclass(frozen=True, slots=True)
class Edge:
    source: DeliveryStatus
    target: DeliveryStatus
    by: By
    why: str


def _edges(
    by: By, why: str, sources: Iterable[DeliveryStatus], *targets: DeliveryStatus
) -> list[Edge]:
    return [Edge(s, t, by, why) for s in sources for t in targets if s is not t]


#: Every change of a delivery's status kirim makes. A new delivery starts pending (or
#: suppressed, by a throttle or preferences at enqueue).
EDGES: tuple[Edge, ...] = (
    *_edges(By.INTAKE, "throttled at enqueue", [P], X),
    *_edges(By.CLAIM, "claimed", [P], R),
    *_edges(By.CLAIM, "preferences at claim", [P, R], X),
    *_edges(By.WORKER, "finished", [R], S, F, D, P, X),
    # a suppressed delivery too: only through the stated residual window (a request
    # that left, unknown to the claim that suppressed it), and the fact wins
    *_edges(By.LATE, "a late success is a fact", [P, R, F, D, C, X], S),
    *_edges(By.LATE, "a late refusal withdraws an assumption", [S, D], P, F),
    *_edges(By.REAPER, "lease expired on the final attempt", [R], F, D),
    *_edges(By.OPERATOR, "cancel", [P, R, F, D], C),
    *_edges(By.OPERATOR, "retry a dead letter", [F, D, C], P),
    *_edges(By.OPERATOR, "reconcile", [P, R, F, D, S], S, F),
    # nothing found, its job with attempts left: back to its route (explorer seed 21462)
    *_edges(By.OPERATOR, "reconcile", [D, S], P),
    # suppressed too: a request before an operator's retry that the retry's claim,
    # withheld by the preferences, no longer counted (explorer seed 40759)
    *_edges(By.PROVIDER, "delivered or bounced", [P, R, S, F, D, C, X], OK, B),
    *_edges(By.PROVIDER, "another copy delivered", [B], OK),
)

_PAIRS = frozenset((e.source, e.target) for e in EDGES)

#: Statuses no edge leaves.
TERMINAL = frozenset(s for s in DeliveryStatus if not any(e.source is s for e in EDGES))


def is_edge(source: DeliveryStatus, target: DeliveryStatus) -> bool:
    """Whether kirim may move a delivery from ``source`` to ``target``."""
    return source is target or (source, target) in _PAIRS


@functools.lru_cache(maxsize=4)
def _by_name(pairs: frozenset[tuple[DeliveryStatus, DeliveryStatus]]) -> frozenset[tuple[str, str]]:
    """The edges ``pairs`` (and every status to itself) by the names rows hold: what
    ``check`` looks a written change up in, no member made."""
    return frozenset((str(s), str(t)) for s, t in pairs) | {
        (str(s), str(s)) for s in DeliveryStatus
    }


def check(delivery_id: int, source: str, target: str, where: str) -> bool:
    """Log an error when a written change of status is not an edge; True when it is."""
    if (source, target) in _by_name(_PAIRS) or is_edge(
        DeliveryStatus(source), DeliveryStatus(target)
    ):
        return True
    log.error(
        "unknown_edge",
        extra={"delivery_id": delivery_id, "source": source, "target": target, "where": where},
    )
    return False


# -- what a delivery may do -------------------------------------------------------------


def can_cancel(d: Delivery) -> bool:
    """Neither in flight nor sent (a processing delivery whose claim was revoked by the
    reaper or at shutdown is not in flight)."""
    if d.status in (P, F, D):
        return True
    return d.status is R and d.claim_token is None


def can_retry(d: Delivery, jobs: Iterable[Job | None]) -> bool:
    """Whether an operator may send the delivery again: a dead letter."""
    return d.status in (F, D, C) and any(j is not None and j.status is JobStatus.DEAD for j in jobs)


def can_reconcile(d: Delivery) -> bool:
    """In doubt (held, or sent under an assumption): its provider may be asked."""
    return d.doubt in (Doubt.HELD, Doubt.ASSUMED_SENT)


def reopens(d: Delivery) -> bool:
    """Whether the delivery rests on an assumption a late refusal can withdraw."""
    assumed = d.status is S and d.doubt is Doubt.ASSUMED_SENT
    held = d.status is D and d.doubt is Doubt.HELD
    return assumed or held


# -- the diagram ---------------------------------------------------------------------------


def mermaid() -> str:
    """The edge table as a Mermaid state diagram (docs/design.md shows it; a test keeps
    the two the same)."""
    labels: dict[tuple[str, str], list[str]] = {}
    for e in EDGES:
        found = labels.setdefault((str(e.source), str(e.target)), [])
        if str(e.by) not in found:
            found.append(str(e.by))
    lines = ["stateDiagram-v2", "    [*] --> pending: intake", "    [*] --> suppressed: intake"]
    for (source, target), by in labels.items():
        lines.append(f"    {source} --> {target}: {', '.join(by)}")
    lines += [f"    {s} --> [*]" for s in sorted(str(t) for t in TERMINAL)]
    return "\n".join(lines)
