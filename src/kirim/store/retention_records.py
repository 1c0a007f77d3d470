"""Retention of workflow runs, topic events and ended subscriptions: part of each round
of ``kirim.store.retention.prune``, each step bounded by its ``limit``.

- **Runs** (``kirim_runs``, ``kirim_run_steps``). A run goes with its steps when it is
  over (``over``: done, or canceled with nothing left to come back for, its
  ``next_at`` empty: a canceled run rechecked later, ``kirim.store.flows.RECHECK``,
  stays while it may come back), it was last changed before ``now - keep``, and none
  of its steps' deliveries is kept. The order is one way: the delivery prune takes a
  run's deliveries only once the run is over (a branch still to come reads its step's
  delivery; a canceled run comes back to cancel them), then the run goes once they
  are all gone: no step names a delivery that is not there while the run may read
  it, and no run goes while one of its deliveries is kept. Its key stays as a
  tombstone (``kirim_run_tombstones``) for ``keys`` after the prune, as a delivery's
  does: the event given again starts no second run (``start`` answers the tombstone:
  the run as it ended, its steps, data and messages gone, ``created`` False; on
  PostgreSQL, a start whose insert waited on the key of a run being pruned undoes
  its insert once it sees the tombstone: ``drop_pruned_run_twin``).
- **Topic events** (``kirim_topic_events``): one fully fanned out (done) before ``now -
  keep`` goes, never one still expanding, nor the newest (SQLite would give its id
  again); its type, event id and topic stay as a tombstone for ``keys``, so the event
  given again is found (done) and not fanned out again to the subscribers of the day.
- **Subscriptions** (``kirim_topic_subscriptions``): an unsubscribe keeps the row (a
  fan-out running reads the subscribers as of its mark); one ended before ``now -
  keep`` goes once no event still expanding on its topic has a mark before its end.

The candidates are found without locks, then the runs and topic events are locked
(PostgreSQL: ``FOR UPDATE SKIP LOCKED``, in id order) and judged again on the rows
read under the locks.
"""

from __future__ import annotations

from dataclasses import dataclass

from kirim.runs import Run, RunStatus
from kirim.store.sequence import Operation, Query
from kirim.topics import TopicEventStatus

#: the statuses of a run that may be over (``over`` also asks that nothing is due)
_OVER = (RunStatus.DONE, RunStatus.CANCELED)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordsPruned:
    """What one round did to the runs, topic events and subscriptions."""

    runs: int = 0
    run_steps: int = 0
    #: digest windows of runs (workflows' digest step) whose members all went
    run_digests: int = 0
    topic_events: int = 0
    subscriptions: int = 0
    #: tombstones of runs and topic events expired (``keys`` after their prune)
    tombstones_expired: int = 0
    #: a step was full: another round may find more
    more: bool = False


def over(run: Run) -> bool:
    """Whether nothing will happen to the run any more: done, or canceled with no
    delivery to come back for (its ``next_at`` empty)."""
    return run.status in _OVER and run.next_at is None


def prune_records(
    now: float, before: float, forgotten: float, limit: int, dry_run: bool
) -> Operation[RecordsPruned]:
    """Prune up to ``limit`` runs over and topic events done before ``before``, ended
    subscriptions, and tombstones of runs and topic events written before
    ``forgotten`` (``dry_run``: count them, delete nothing)."""
    if dry_run:
        (found,) = yield Query("prune_count_records", {"before": before, "forgotten": forgotten})
        return RecordsPruned(
            runs=int(found["runs"]),
            run_steps=int(found["run_steps"]),
            run_digests=int(found["run_digests"]),
            topic_events=int(found["topic_events"]),
            subscriptions=int(found["subscriptions"]),
            tombstones_expired=int(found["tombstones_expired"]),
        )
    bounded = {"before": before, "limit": limit}
    candidates = yield Query("prune_run_candidates", bounded)
    runs, steps = yield from _prune_runs([int(r["id"]) for r in candidates], now, before)
    found = yield Query("prune_topic_event_candidates", bounded)
    events = yield from _prune_topic_events([int(r["id"]) for r in found], now, before)
    ended, runs_expired, events_expired, windows = yield (
        Query("prune_subscriptions", bounded, count=True),
        Query("prune_expire_run_tombstones", {**bounded, "before": forgotten}, count=True),
        Query("prune_expire_topic_event_tombstones", {**bounded, "before": forgotten}, count=True),
        # digest windows no run is a member of any more, sealed or ended before the cut-off
        Query("prune_run_digests", bounded, count=True),
    )
    full = (
        len(candidates),
        len(found),
        int(ended),
        int(runs_expired),
        int(events_expired),
        int(windows),
    )
    return RecordsPruned(
        runs=runs,
        run_steps=steps,
        run_digests=int(windows),
        topic_events=events,
        subscriptions=int(ended),
        tombstones_expired=int(runs_expired) + int(events_expired),
        more=any(n >= limit for n in full),
    )


def _prune_runs(ids: list[int], now: float, before: float) -> Operation[tuple[int, int]]:
    """Lock the candidate runs, judge them on what the locks hold, leave a tombstone of
    each that goes, and delete it with its steps: (runs, steps) deleted."""
    if not ids:
        return 0, 0
    from kirim.store import flows  # flows imports retention (key_hash), which imports this

    rows = yield Query("prune_lock_runs", {"ids": ids})
    if not rows:
        return 0, 0
    locked = [flows.run_from(r, lenient=True) for r in rows]
    holding = yield Query("prune_runs_holding", {"ids": [r.id for r in locked]})
    kept = {int(r["run_id"]) for r in holding}
    gone = [r for r in locked if over(r) and r.updated_at < before and r.id not in kept]
    if not gone:
        return 0, 0
    items = [
        {
            "key": r.key,
            "run_id": r.id,
            "type": r.type,
            "event_id": r.event_id,
            "recipient_id": r.recipient_id,
            "status": str(r.status),
            "cursor": r.cursor,
            "why": r.why,
            "created_at": r.created_at,
            "updated_at": r.updated_at,
            "pruned_at": now,
        }
        for r in gone
    ]
    args = {"ids": [r.id for r in gone]}
    yield Query("prune_write_run_tombstones", {"items": items}, count=True)
    n_steps = yield Query("prune_delete_run_steps", args, count=True)
    yield Query("prune_delete_run_digest_members", args, count=True)
    n_runs = yield Query("prune_delete_runs", args, count=True)
    return int(n_runs), int(n_steps)


def _prune_topic_events(ids: list[int], now: float, before: float) -> Operation[int]:
    """Lock the candidate topic events, keep those done before ``before`` (an event
    done stays done), leave a tombstone of each and delete it: how many went."""
    if not ids:
        return 0
    rows = yield Query("prune_lock_topic_events", {"ids": ids})
    gone = [
        r
        for r in rows
        if r["status"] == str(TopicEventStatus.DONE)
        and r["finished_at"] is not None
        and float(r["finished_at"]) < before
    ]
    if not gone:
        return 0
    items = [
        {
            "type": r["type"],
            "event_id": r["event_id"],
            "topic": r["topic"],
            "id": int(r["id"]),
            "mark": int(r["mark"]),
            "batches": int(r["batches"]),
            "recipients": int(r["recipients"]),
            "created_at": float(r["created_at"]),
            "finished_at": float(r["finished_at"]),
            "pruned_at": now,
        }
        for r in gone
    ]
    yield Query("prune_write_topic_event_tombstones", {"items": items}, count=True)
    n = yield Query("prune_delete_topic_events", {"ids": [int(r["id"]) for r in gone]}, count=True)
    return int(n)


__all__ = ["RecordsPruned", "over", "prune_records"]
