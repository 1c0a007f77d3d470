"""Retention: finished deliveries go, their keys are remembered a while longer.

The ledger only grows unless it is pruned. ``prune`` (an ``Operation``, see
``sequence``: written once, run by either backend in one transaction of its own)
deletes up to ``limit`` finished deliveries last changed more than ``keep`` seconds
ago, with their jobs, attempts and the HTTP service's request rows, and leaves for
each a *tombstone*: the sha256 of its idempotency key, its id, final status, doubt
and creation time. While the tombstone lasts (``keys`` seconds after the prune) a
``notify()`` with that key still creates nothing (``EnqueueResult.pruned``); then
the tombstone goes too and the key is free again.

A delivery is finished, and may go, when all of these hold (``prunable``):

- its status is sent, delivered, bounced, failed, canceled or suppressed (never
  in_doubt: an operator owes it a look);
- none of its jobs is active (every one completed or dead);
- none of its attempts is unsettled: one that may have reached the provider
  (requested, unknown) counts as settled only once its ``settles_at`` has passed (a
  row without one, written before schema version 3, never does: it stays);
- it was last changed before ``now - keep``;
- it holds none of the newest delivery, job and attempt ids: SQLite gives a new row the
  largest id of its table plus one, so pruning the newest row would hand its id out
  again (a tombstone's id, a ``Location`` a client kept, would name another delivery).
  The rule is the same on PostgreSQL, whose identities never repeat: at most three
  deliveries wait for the next ones;
- if it is a digest's delivery, the digest's window is closed (``closed``: it ended
  more than ``WINDOW_GRACE`` ago), so no event can still join the digest, nor make it
  again once it is gone.

The candidates are found without locks, then locked (PostgreSQL: jobs, then the
digests, then the deliveries, each table in id (key) order, ``FOR UPDATE SKIP
LOCKED``: prune never waits for a worker, nor makes one wait; what it skips goes in a
later round), then judged again here on the rows read under the locks, so that a
delivery revived meanwhile (an operator's retry, a late answer) stays.

The notification layer's tables are pruned in the same rounds, each step bounded by
``limit`` and counted in ``PruneResult``:

- **Digests** (``kirim_digests``, ``kirim_digest_events``). A digest goes with its
  delivery, its events' data too, but not their dedup: ``UNIQUE (stream, event_id)``
  is what keeps an event given again out of a second digest, so it lasts as long as
  the delivery's key tombstone, as the delivery's own key does. When the delivery is
  pruned, its digest is marked (``pruned_at``: the tombstone's time). Then, each round,
  up to ``limit`` events of marked digests lose their data (``data`` becomes
  ``null``; the row keeps stream, event id and digest key, and takes the digest's
  ``pruned_at``), and up to ``limit`` marked digests none of whose events holds data
  any more are deleted: a digest of any size goes in bounded steps. An event given
  again finds its row, then the tombstone of its digest's key, and is answered
  ``pruned`` (``kirim.store.digests``): no digest, no delivery. Its row is deleted
  (up to ``limit`` a round) once that ``pruned_at`` is ``keys`` old: the tombstone's
  own cutoff. The tombstone is the one clock: a row that outlives it (the batches are
  bounded apart) finds neither delivery nor tombstone, and the enqueue forgets it
  there: the event is new again, as the key is.
- **Feed messages** (``kirim_feed``, the in-app inbox): a message goes ``keep`` after it
  came; an archived or deleted one ``archived`` after that (when ``archived`` is
  given), if sooner. Never while its delivery has an attempt that may still land (a
  stalled worker's late commit would find its key free and write it again).
- **Throttle counters** (``kirim_throttle``): a counter goes once its window ended more
  than ``WINDOW_GRACE`` ago. Nothing counts into a window after its end (the throttle
  takes the window of the enqueue's time or later), so the limit of every window that
  can still be counted into stays exact; the grace covers an enqueue whose time was
  read before the end and whose transaction waited for a lock past it, and a host
  whose clock is a little behind.

Workflow runs, topic events and ended subscriptions go in the same rounds, after the
deliveries (``kirim.store.retention_records``). A delivery of a run's step stays while
the run is not over (waiting, or canceled and coming back): ``prune_candidates``
skips it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kirim.model import (
    AT_REST,
    Attempt,
    Delivery,
    DeliveryStatus,
    Doubt,
    Job,
    JobStatus,
)
from kirim.store.base import Prunes
from kirim.store.retention_records import prune_records
from kirim.store.rows import Row, attempt_from, delivery_from, job_from
from kirim.store.sequence import TIME, Operation, Query

#: deliveries per prune transaction, by default
BATCH = 500
#: how long after its end a fixed window (a throttle counter's, a digest's) is closed:
#: no enqueue can still count into it or add to it (one that read its time before the
#: end and waited for a lock since, a host whose clock is behind)
WINDOW_GRACE = 3600.0
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
    #: digests deleted, their deliveries pruned and their events' data gone
    digests: int = 0
    #: events of pruned digests whose data went (the row stays for its dedup)
    digest_events: int = 0
    #: those rows deleted, ``keys`` after their digest was pruned
    digest_events_expired: int = 0
    #: throttle counters of windows closed (``WINDOW_GRACE`` after their end)
    throttle_expired: int = 0
    #: feed messages (the in-app inbox) past their keep time, or their archived one
    feed_items: int = 0
    #: workflow runs over, with their steps (``kirim.store.retention_records``)
    runs: int = 0
    run_steps: int = 0
    #: the runs' digest windows (a workflow's digest step) whose members all went
    run_digests: int = 0
    #: topic events fully fanned out, and subscriptions ended (unsubscribed)
    topic_events: int = 0
    subscriptions: int = 0
    #: tombstones of runs and topic events expired (``keys`` after their prune)
    record_tombstones_expired: int = 0
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
            digests=self.digests + other.digests,
            digest_events=self.digest_events + other.digest_events,
            digest_events_expired=self.digest_events_expired + other.digest_events_expired,
            throttle_expired=self.throttle_expired + other.throttle_expired,
            feed_items=self.feed_items + other.feed_items,
            runs=self.runs + other.runs,
            run_steps=self.run_steps + other.run_steps,
            run_digests=self.run_digests + other.run_digests,
            topic_events=self.topic_events + other.topic_events,
            subscriptions=self.subscriptions + other.subscriptions,
            record_tombstones_expired=self.record_tombstones_expired
            + other.record_tombstones_expired,
            more=other.more,
            dry_run=self.dry_run or other.dry_run,
        )

    @property
    def removed_anything(self) -> bool:
        return bool(
            self.deliveries
            or self.tombstones_expired
            or self.digests
            or self.digest_events
            or self.digest_events_expired
            or self.throttle_expired
            or self.feed_items
            or self.runs
            or self.run_steps
            or self.run_digests
            or self.topic_events
            or self.subscriptions
            or self.record_tombstones_expired
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "deliveries": self.deliveries,
            "jobs": self.jobs,
            "attempts": self.attempts,
            "requests": self.requests,
            "tombstones_written": self.tombstones_written,
            "tombstones_expired": self.tombstones_expired,
            "digests": self.digests,
            "digest_events": self.digest_events,
            "digest_events_expired": self.digest_events_expired,
            "throttle_expired": self.throttle_expired,
            "feed_items": self.feed_items,
            "runs": self.runs,
            "run_steps": self.run_steps,
            "topic_events": self.topic_events,
            "subscriptions": self.subscriptions,
            "record_tombstones_expired": self.record_tombstones_expired,
            "run_digests": self.run_digests,
        }


# -- the rule ----------------------------------------------------------------------------


def unsettled(a: Attempt, now: float) -> bool:
    """The attempt may still cause a request to land: no prune while it might."""
    return a.status.in_doubt and (a.settles_at is None or a.settles_at > now)


def closed(window_end: float, now: float) -> bool:
    """Whether a fixed window that ends at ``window_end`` is closed at ``now``: it ended
    more than ``WINDOW_GRACE`` ago (nothing can count into it, nor add to it)."""
    return window_end < now - WINDOW_GRACE


def prunable(
    d: Delivery,
    jobs: Iterable[Job],
    attempts: Iterable[Attempt],
    *,
    before: float,
    now: float,
    newest: Collection[int] = (),
    windows: Iterable[float] = (),
) -> bool:
    """Whether the delivery is finished and old enough to go (see the module's doc);
    ``newest``: the deliveries that hold the newest delivery, job and attempt ids;
    ``windows``: the ends of the windows of its digest (if it is a digest's delivery)."""
    return (
        d.status in AT_REST
        and d.id not in newest
        and d.updated_at < before
        and all(j.status in _SETTLED_JOBS for j in jobs)
        and not any(unsettled(a, now) for a in attempts)
        and all(closed(end, now) for end in windows)
    )


# -- the operation -------------------------------------------------------------------------


def prune(
    given: float,
    keep: float,
    keys: float,
    limit: int = BATCH,
    dry_run: bool = False,
    archived: float | None = None,
) -> Operation[PruneResult]:
    """Prune up to ``limit`` deliveries finished before ``now - keep`` (with their
    digests), up to ``limit`` of each of: events of pruned digests to empty, pruned
    digests to delete, their events' rows written before ``now - keys``, tombstones
    written before ``now - keys``, throttle counters of closed windows, feed messages
    that came before ``now - keep`` or were archived (deleted) before ``now -
    archived`` (``now``: the store's time of record for ``given``). ``dry_run``: count
    everything that would go now, delete nothing."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    at = yield TIME
    now = at(given)
    before, forgotten, shut = now - keep, now - keys, now - WINDOW_GRACE
    feed = {
        "before": before,
        "archived_before": before if archived is None else max(before, now - archived),
        "now": now,
    }
    (top,) = yield Query("prune_newest")
    held = (top["delivery"], top["job"], top["attempt"])
    newest = sorted({int(v) for v in held if v is not None})
    if dry_run:
        args = {"now": now, "before": before, "newest": newest, "closed": shut}
        (found,) = yield Query("prune_count", args)
        (old,) = yield Query("prune_count_tombstones", {"before": forgotten})
        (rest,) = yield Query("prune_count_layer", {"before": forgotten, "closed": shut})
        (messages,) = yield Query("prune_count_feed", feed)
        records = yield from prune_records(now, before, forgotten, 1, dry_run=True)
        return PruneResult(
            deliveries=int(found["deliveries"]),
            jobs=int(found["jobs"] or 0),
            attempts=int(found["attempts"] or 0),
            requests=int(found["requests"] or 0),
            tombstones_written=int(found["deliveries"]),
            tombstones_expired=int(old["n"]),
            digests=int(found["digests"] or 0) + int(rest["digests"]),
            digest_events=int(found["digest_events"] or 0) + int(rest["digest_events"]),
            digest_events_expired=int(rest["digest_events_expired"]),
            throttle_expired=int(rest["throttle_expired"]),
            feed_items=int(messages["n"]),
            runs=records.runs,
            run_steps=records.run_steps,
            run_digests=records.run_digests,
            topic_events=records.topic_events,
            subscriptions=records.subscriptions,
            record_tombstones_expired=records.tombstones_expired,
            dry_run=True,
        )
    args = {"now": now, "before": before, "newest": newest, "closed": shut, "limit": limit}
    candidates = yield Query("prune_candidates", args)
    result = PruneResult(more=len(candidates) >= limit)
    if candidates:
        ids = sorted(int(r["id"]) for r in candidates)
        named = sorted(str(r["idempotency_key"]) for r in candidates)
        result = yield from _prune_deliveries(ids, named, now, before, newest, result)
    bounded = {"limit": limit}
    emptied, digests, events, tombstones, counters, messages = yield (
        Query("prune_empty_digest_events", bounded, count=True),
        Query("prune_delete_digests", bounded, count=True),
        Query("prune_expire_digest_events", {"before": forgotten, **bounded}, count=True),
        Query("prune_expire_tombstones", {"before": forgotten, **bounded}, count=True),
        Query("prune_expire_throttle", {"closed": shut, **bounded}, count=True),
        Query("prune_feed", {**feed, **bounded}, count=True),
    )
    steps = (emptied, digests, events, tombstones, counters, messages)
    # After the deliveries: a run goes once its last delivery went (retention_records).
    records = yield from prune_records(now, before, forgotten, limit, dry_run=False)
    return replace(
        result,
        tombstones_expired=int(tombstones),
        digests=int(digests),
        digest_events=int(emptied),
        digest_events_expired=int(events),
        throttle_expired=int(counters),
        feed_items=int(messages),
        runs=records.runs,
        run_steps=records.run_steps,
        run_digests=records.run_digests,
        topic_events=records.topic_events,
        subscriptions=records.subscriptions,
        record_tombstones_expired=records.tombstones_expired,
        more=result.more or records.more or any(n >= limit for n in steps),
    )


def _prune_deliveries(
    ids: Sequence[int],
    keys: Sequence[str],
    now: float,
    before: float,
    newest: Sequence[int],
    result: PruneResult,
) -> Operation[PruneResult]:
    """Lock the candidates (``ids``, their idempotency keys ``keys``: jobs, then
    digests, then deliveries), judge them on what the locks hold, delete them, and mark
    their digests pruned."""
    locked_jobs = yield Query("prune_lock_jobs", {"ids": list(ids)})
    locked_digests = yield Query("prune_lock_digests", {"keys": list(keys)})
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
    mine = sorted(str(r["idempotency_key"]) for r in rows)
    digests = {str(r["key"]): r for r in (yield Query("prune_digests_of", {"keys": mine}))}
    ours = {int(r["id"]) for r in locked_jobs}
    ours_digests = {str(r["key"]) for r in locked_digests}
    gone: list[Delivery] = []
    for row in rows:
        d = delivery_from(row)
        carriers = jobs.get(d.id, [])
        if not all(j.id in ours for j in carriers):
            continue  # a job it gained since, or one another transaction holds
        digest = digests.get(d.idempotency_key)
        if digest is not None and d.idempotency_key not in ours_digests:
            continue  # its digest, which another transaction holds
        windows = () if digest is None else (float(digest["window_end"]),)
        found = attempts.get(d.id, ())
        if prunable(d, carriers, found, before=before, now=now, newest=newest, windows=windows):
            gone.append(d)
    if not gone:
        return result
    items = [
        {
            "key_hash": key_hash(d.idempotency_key),
            "delivery_id": d.id,
            "status": str(d.status),
            "doubt": None if d.doubt is None else str(d.doubt),
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
    yield Query("prune_delete_message_ids", args, count=True)
    n_deliveries = yield Query("prune_delete_deliveries", args, count=True)
    marked = sorted(d.idempotency_key for d in gone if d.idempotency_key in digests)
    if marked:  # their events' data goes next (bounded), then the digests
        yield Query("prune_mark_digests", {"keys": marked, "now": now}, count=True)
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
    """The delivery a tombstone stands for: its id, key, final status, doubt and
    creation time; what was pruned with it (event, recipient, channel, payload…) is
    empty."""
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
        doubt=None if row["doubt"] is None else Doubt(row["doubt"]),
        last_error=None,
        created_at=seen,
        updated_at=seen,
        sent_at=None,
    )


__all__ = [
    "BATCH",
    "WINDOW_GRACE",
    "PruneResult",
    "Prunes",
    "closed",
    "delivery_from_tombstone",
    "key_hash",
    "prunable",
    "prune",
    "unsettled",
]
