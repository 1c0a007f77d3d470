"""Retention: finished deliveries go, their keys are remembered a while longer.

The ledger only grows unless it is pruned. ``prune`` (an ``Operation``, see
``sequence``: written once, run by either backend in one transaction of its own)
deletes up to ``limit`` finished deliveries last changed more than ``keep`` seconds
ago, with their jobs, attempts and the HTTP service's request rows, and leaves for
each a *tombstone*: the sha256 of its idempotency key, its id, final status and
creation time. While the tombstone lasts (``keys`` seconds after the prune) a
``notify()`` with that key still creates nothing (``EnqueueResult.pruned``); then
the tombstone goes too and the key is free again.

A delivery is finished, and may go, when all of these hold (``prunable``):

- its status is sent, delivered, bounced, failed or canceled (never in_doubt: an
  operator owes it a look);
- none of its jobs is active (every one completed or dead);
- none of its attempts is unsettled: one that may have reached the provider
  (requested, unknown) counts as settled only once its ``settles_at`` has passed (a
  row without one, written before schema version 3, never does: it stays);
- it was last changed before ``now - keep``;
- it holds none of the newest delivery, job and attempt ids: SQLite gives a new row the
  largest id of its table plus one, so pruning the newest row would hand its id out
  again (a tombstone's id, a ``Location`` a client kept, would name another delivery).
  The rule is the same on PostgreSQL, whose identities never repeat: at most three
  deliveries wait for the next ones.

The candidates are found without locks, then locked (PostgreSQL: jobs before
deliveries, each table in id order, ``FOR UPDATE SKIP LOCKED``: prune never waits for
a worker, nor makes one wait; what it skips goes in a later round), then judged again
here on the rows read under the locks, so that a delivery revived meanwhile (an
operator's retry, a late answer) stays.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kirim.model import (
    FINAL_DELIVERY,
    Attempt,
    Delivery,
    DeliveryStatus,
    Job,
    JobStatus,
)
from kirim.store.rows import Row, attempt_from, delivery_from, job_from
from kirim.store.sequence import TIME, Operation, Query

#: deliveries per prune transaction, by default
BATCH = 500
#: the job statuses that carry nothing any more
_SETTLED_JOBS = (JobStatus.COMPLETED, JobStatus.DEAD)


def key_hash(key: str) -> str:
    """What a tombstone keeps of an idempotency key: its sha256, in hex."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class PruneResult:
    """What one prune did (or, with ``dry_run``, would do)."""

    deliveries: int = 0
    attempts: int = 0
    jobs: int = 0
    #: the HTTP service's request rows of those deliveries
    requests: int = 0
    tombstones_written: int = 0
    tombstones_expired: int = 0
    #: the batch was full: another call may find more (never with ``dry_run``)
    more: bool = False
    dry_run: bool = False

    def __add__(self, other: PruneResult) -> PruneResult:
        """The totals of two batches (``more`` is the later one's)."""
        return PruneResult(
            deliveries=self.deliveries + other.deliveries,
            attempts=self.attempts + other.attempts,
            jobs=self.jobs + other.jobs,
            requests=self.requests + other.requests,
            tombstones_written=self.tombstones_written + other.tombstones_written,
            tombstones_expired=self.tombstones_expired + other.tombstones_expired,
            more=other.more,
            dry_run=self.dry_run or other.dry_run,
        )

    @property
    def removed_anything(self) -> bool:
        return bool(self.deliveries or self.tombstones_expired)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "deliveries": self.deliveries,
            "jobs": self.jobs,
            "attempts": self.attempts,
            "requests": self.requests,
            "tombstones_written": self.tombstones_written,
            "tombstones_expired": self.tombstones_expired,
        }


@runtime_checkable
class Prunes(Protocol):
    """A store that prunes its ledger (both backends)."""

    async def prune(
        self, *, now: float, keep: float, keys: float, limit: int = BATCH, dry_run: bool = False
    ) -> PruneResult:
        """One batch (one transaction): see ``kirim.store.retention.prune``."""
        ...


# -- the rule ----------------------------------------------------------------------------


def unsettled(a: Attempt, now: float) -> bool:
    """The attempt may still cause a request to land: no prune while it might."""
    return a.status.in_doubt and (a.settles_at is None or a.settles_at > now)


def prunable(
    d: Delivery,
    jobs: Iterable[Job],
    attempts: Iterable[Attempt],
    *,
    before: float,
    now: float,
    newest: Collection[int] = (),
) -> bool:
    """Whether the delivery is finished and old enough to go (see the module's doc);
    ``newest``: the deliveries that hold the newest delivery, job and attempt ids."""
    return (
        d.status in FINAL_DELIVERY
        and d.id not in newest
        and d.updated_at < before
        and all(j.status in _SETTLED_JOBS for j in jobs)
        and not any(unsettled(a, now) for a in attempts)
    )


# -- the operation -------------------------------------------------------------------------


def prune(
    given: float, keep: float, keys: float, limit: int = BATCH, dry_run: bool = False
) -> Operation[PruneResult]:
    """Prune up to ``limit`` deliveries finished before ``now - keep`` and up to ``limit``
    tombstones written before ``now - keys`` (``now``: the store's time of record for
    ``given``). ``dry_run``: count everything that would go now, delete nothing."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    at = yield TIME
    now = at(given)
    before, forgotten = now - keep, now - keys
    (top,) = yield Query("prune_newest")
    held = (top["delivery"], top["job"], top["attempt"])
    newest = sorted({int(v) for v in held if v is not None})
    if dry_run:
        args = {"now": now, "before": before, "newest": newest}
        (found,) = yield Query("prune_count", args)
        (old,) = yield Query("prune_count_tombstones", {"before": forgotten})
        return PruneResult(
            deliveries=int(found["deliveries"]),
            jobs=int(found["jobs"] or 0),
            attempts=int(found["attempts"] or 0),
            requests=int(found["requests"] or 0),
            tombstones_written=int(found["deliveries"]),
            tombstones_expired=int(old["n"]),
            dry_run=True,
        )
    args = {"now": now, "before": before, "newest": newest, "limit": limit}
    candidates = yield Query("prune_candidates", args)
    result = PruneResult(more=len(candidates) >= limit)
    if candidates:
        ids = sorted(int(r["id"]) for r in candidates)
        result = yield from _prune_deliveries(ids, now, before, newest, result)
    expired = yield Query(
        "prune_expire_tombstones", {"before": forgotten, "limit": limit}, count=True
    )
    return PruneResult(
        deliveries=result.deliveries,
        attempts=result.attempts,
        jobs=result.jobs,
        requests=result.requests,
        tombstones_written=result.tombstones_written,
        tombstones_expired=int(expired),
        more=result.more or expired >= limit,
    )


def _prune_deliveries(
    ids: Sequence[int], now: float, before: float, newest: Sequence[int], result: PruneResult
) -> Operation[PruneResult]:
    """Lock the candidates (jobs first), judge them on what the locks hold, delete."""
    locked_jobs = yield Query("prune_lock_jobs", {"ids": list(ids)})
    rows: list[Row] = yield Query("prune_lock_deliveries", {"ids": list(ids)})
    if not rows:
        return result
    held = [int(r["id"]) for r in rows]
    # Read after the locks: rows committed by the transactions the locks waited for.
    jobs: dict[int, list[Job]] = {}
    for row in (yield Query("prune_jobs_of", {"ids": held})):
        jobs.setdefault(int(row["delivery_id"]), []).append(job_from(row))
    attempts: dict[int, list[Attempt]] = {}
    for row in (yield Query("attempts_of_deliveries", {"ids": held})):
        attempts.setdefault(int(row["delivery_id"]), []).append(attempt_from(row))
    ours = {int(r["id"]) for r in locked_jobs}
    gone: list[Delivery] = []
    for row in rows:
        d = delivery_from(row)
        carriers = jobs.get(d.id, [])
        if not all(j.id in ours for j in carriers):
            continue  # a job it gained since, or one another transaction holds
        found = attempts.get(d.id, ())
        if prunable(d, carriers, found, before=before, now=now, newest=newest):
            gone.append(d)
    if not gone:
        return result
    items = [
        {
            "key_hash": key_hash(d.idempotency_key),
            "delivery_id": d.id,
            "status": str(d.status),
            "seen_at": d.created_at,
            "pruned_at": now,
        }
        for d in gone
    ]
    args = {"ids": [d.id for d in gone]}
    written = yield Query("prune_write_tombstones", {"items": items}, count=True)
    n_attempts = yield Query("prune_delete_attempts", args, count=True)
    n_jobs = yield Query("prune_delete_jobs", args, count=True)
    n_requests = yield Query("prune_delete_requests", args, count=True)
    yield Query("prune_delete_confirmations", args, count=True)
    n_deliveries = yield Query("prune_delete_deliveries", args, count=True)
    return PruneResult(
        deliveries=int(n_deliveries),
        attempts=int(n_attempts),
        jobs=int(n_jobs),
        requests=int(n_requests),
        tombstones_written=int(written),
        more=result.more,
    )


# -- a pruned key, as enqueue answers it --------------------------------------------------


def delivery_from_tombstone(row: Row, key: str) -> Delivery:
    """The delivery a tombstone stands for: its id, key, final status and creation time;
    what was pruned with it (event, recipient, channel, payload…) is empty."""
    seen = float(row["seen_at"])
    return Delivery(
        id=int(row["delivery_id"]),
        idempotency_key=key,
        event_id="",
        recipient="",
        channel="",
        payload={},
        payload_hash="",
        status=DeliveryStatus(row["status"]),
        claim_token=None,
        claimed_by=None,
        claim_expires_at=None,
        provider_message_id=None,
        doubt=None,
        last_error=None,
        created_at=seen,
        updated_at=seen,
        sent_at=None,
    )


__all__ = [
    "BATCH",
    "PruneResult",
    "Prunes",
    "delivery_from_tombstone",
    "key_hash",
    "prunable",
    "prune",
    "unsettled",
]
