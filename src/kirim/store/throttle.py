"""The throttle of the intake: at most ``limit`` deliveries per window of a scope,
counted in the ledger (``kirim_throttle``), written once for both backends.

A delivery the enqueue has just created takes a slot in the window that holds its
due time (its job's ``run_at``, or the enqueue's time if that is later) with one
upsert: ``INSERT ... ON CONFLICT (scope, window_start) DO UPDATE SET count = count + 1
WHERE count < limit RETURNING count``. The statement locks the counter's row
(PostgreSQL: a second transaction waits, then sees the first's count; SQLite: the
database's write lock), so the count is exact across processes and hosts, and it
never passes the limit: a delivery that finds no room is not counted.

Over the limit, ``Throttle.over`` decides: ``suppress`` records the delivery
``suppressed`` (reason ``throttled``) and completes its job; ``defer`` takes a slot in
the next window with room (each one tried in turn) and moves the job there. A key
enqueued again takes nothing: only a delivery the enqueue made counts (a digest's: once, by
the event that made it).

A counter keeps its window's end (``window_end``): nothing counts into a window once
it has ended, and prune deletes the counter ``retention.WINDOW_GRACE`` after that.

Lock order: counters in scope order, windows ascending, after the deliveries and the
digests of the same transaction (``kirim.store.admission``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kirim.errors import StoreError
from kirim.model import DeliveryStatus, EnqueueResult, JobStatus
from kirim.preferences import Reason
from kirim.store.base import NewDelivery, Throttle
from kirim.store.rows import evolve
from kirim.store.sequence import Operation, Query

#: how many later windows ``defer`` looks through for room before it gives up
MAX_WINDOWS = 10_000
#: how many full windows one read returns while ``defer`` looks for room
PAGE = 512


def window_start(t: float, window: float) -> float:
    """The start of the fixed window of ``window`` seconds (aligned on the epoch) that
    holds ``t``."""
    return math.floor(t / window) * window


def counts(item: NewDelivery, result: EnqueueResult) -> bool:
    """Whether the throttle of ``item`` counts ``result``, a delivery this enqueue made:
    not when it is suppressed already."""
    return (
        item.throttle is not None
        and result.job is not None
        and result.delivery.status is DeliveryStatus.PENDING
    )


def apply(
    items: Sequence[NewDelivery],
    results: Sequence[EnqueueResult],
    made: Sequence[int],
    now: float,
) -> Operation[list[EnqueueResult]]:
    """Take a slot for each delivery this enqueue made (``results[i]`` for ``i`` in
    ``made``) that ``counts`` says the throttle counts; the results with the deliveries
    over the limit suppressed or deferred (``now``: store time)."""
    todo = [i for i in made if counts(items[i], results[i])]
    out = list(results)
    if not todo:
        return out
    todo.sort(key=lambda i: (_rule(items[i]).scope, i))
    suppressed: list[int] = []
    deferred: dict[int, float] = {}
    for i in todo:
        rule, job = _rule(items[i]), results[i].job
        assert job is not None
        start = window_start(max(job.run_at, now), rule.window)
        if (yield from _take(rule, start)):
            continue
        if rule.over == "suppress":
            suppressed.append(i)
            continue
        deferred[i] = yield from _first_room(rule, start)
    writes = (*_suppress(out, suppressed, now), *_defer(out, deferred, now))
    if writes:
        yield writes
    return out


def _rule(item: NewDelivery) -> Throttle:
    assert item.throttle is not None
    return item.throttle


def _take(rule: Throttle, start: float) -> Operation[bool]:
    """One slot of the window at ``start``, if it has room."""
    if rule.limit < 1:
        return False
    args = {
        "scope": rule.scope,
        "window_start": start,
        "window_end": start + rule.window,
        "limit": rule.limit,
    }
    got = yield Query("take_throttle", args)
    return bool(got)


def _first_room(rule: Throttle, start: float) -> Operation[float]:
    """The start of the first window after ``start`` with room, its slot taken. The full
    windows ahead are read a page at a time and skipped, so a backlog of n full windows
    costs n / PAGE reads, not n attempts to take a slot."""
    if rule.limit < 1:
        raise ValueError(f"throttle {rule.scope!r}: a limit below 1 can only suppress")
    k = 1
    while k <= MAX_WINDOWS:
        args = {"scope": rule.scope, "after_start": start + k * rule.window}
        rows = yield Query("full_throttle_windows", {**args, "limit": rule.limit, "n": PAGE})
        full = {float(r["window_start"]) for r in rows}
        while k <= MAX_WINDOWS and start + k * rule.window in full:
            k += 1
        if len(rows) == PAGE and start + k * rule.window > max(full):
            continue  # past the page read: the windows after it may be full too
        if k > MAX_WINDOWS:
            break
        later = start + k * rule.window
        if (yield from _take(rule, later)):
            return later
        k += 1  # filled meanwhile
    raise StoreError(f"throttle {rule.scope!r}: no room in the next {MAX_WINDOWS} windows")


def _suppress(out: list[EnqueueResult], which: Sequence[int], now: float) -> tuple[Query, ...]:
    """Record these deliveries suppressed (``throttled``) and complete their jobs."""
    if not which:
        return ()
    reason = str(Reason.THROTTLED)
    error = f"suppressed ({reason})"
    for i in which:
        r = out[i]
        assert r.job is not None
        out[i] = evolve(
            r,
            delivery=evolve(
                r.delivery, status=DeliveryStatus.SUPPRESSED, reason=reason, updated_at=now
            ),
            job=evolve(r.job, status=JobStatus.COMPLETED, last_error=error, updated_at=now),
        )
    ids = [{"id": out[i].delivery.id} for i in sorted(which, key=lambda i: out[i].delivery.id)]
    return (
        Query("throttled_deliveries", {"items": ids, "reason": reason, "now": now}, count=True),
        Query("throttled_jobs", {"items": ids, "error": error, "now": now}, count=True),
    )


def _defer(out: list[EnqueueResult], runs: dict[int, float], now: float) -> tuple[Query, ...]:
    """Move these deliveries' jobs to the windows they found room in."""
    if not runs:
        return ()
    items = []
    for i, run_at in sorted(runs.items(), key=lambda kv: out[kv[0]].delivery.id):
        r = out[i]
        assert r.job is not None
        out[i] = evolve(r, job=evolve(r.job, run_at=run_at, updated_at=now))
        items.append({"id": r.job.id, "run_at": run_at})
    return (Query("deferred_jobs", {"items": items, "now": now}, count=True),)
